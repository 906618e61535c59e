"""Inputs are data, never code: a model folder's Python does not run, file contents stay inside their
folder, and every problem with a file names the file and the field.

Each folder here carries code that would leave a marker file if it ran, or names files outside
itself whose tensors must not be read.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import save_file  # noqa: E402

from ftlab.core.usercode import UserCodeError  # noqa: E402
from ftlab.transfer.io import index_shards, load_batches, load_model, load_state_dict  # noqa: E402

EVIL = """
from pathlib import Path
Path({marker!r}).write_text("the folder's code ran")
from transformers import BertConfig, BertModel
class EvilConfig(BertConfig):
    model_type = "evil-bert"
class EvilModel(BertModel):
    config_class = EvilConfig
"""


def _bert_config(**extra) -> dict:
    cfg = transformers.BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=16, max_position_embeddings=16).to_dict()
    return {**cfg, **extra}


@pytest.fixture
def code_folder(tmp_path):
    """A Hugging Face folder whose config asks for its own code (auto_map); running it writes ``marker``."""
    folder, marker = tmp_path / "hf", tmp_path / "marker.txt"
    folder.mkdir()
    (folder / "evil.py").write_text(EVIL.format(marker=str(marker)))
    cfg = _bert_config(model_type="evil-bert", auto_map={"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"})
    (folder / "config.json").write_text(json.dumps(cfg))
    model = transformers.BertModel(transformers.BertConfig(**_bert_config()))
    save_file(model.state_dict(), str(folder / "model.safetensors"))
    return folder, marker


def test_a_model_folders_code_never_runs_unless_asked(code_folder):
    folder, marker = code_folder
    for hf_class in ("AutoModel", "BertModel"):
        with pytest.raises(ValueError, match="auto_map.*does not run a model folder's code.*--trust-remote-code"):
            load_model(None, folder, hf_class=hf_class, role="target base")
    assert not marker.exists()
    # the same folder, when the user asks for its code: it runs (the marker proves the check above could fail)
    load_model(None, folder, hf_class="AutoModel", role="target base", trust_remote_code=True)
    assert marker.read_text() == "the folder's code ran"


def test_no_question_is_asked_even_with_yes_on_stdin(code_folder, tmp_path):
    folder, marker = code_folder
    script = ("import sys\nfrom ftlab.transfer.io import load_model\n"
              f"try:\n    load_model(None, {str(folder)!r}, role='target base')\n"
              "except ValueError as e:\n    print('refused:', e)\n")
    r = subprocess.run([sys.executable, "-c", script], input="y\ny\n", capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("refused:") and "[y/N]" not in r.stdout + r.stderr
    assert not marker.exists()


def _shards(folder: Path, weight_map: dict) -> None:
    folder.mkdir(exist_ok=True)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_shard_names_stay_inside_the_model_folder(tmp_path):
    save_file({"w": torch.full((2,), 7.0)}, str(tmp_path / "outside.safetensors"))
    folder = tmp_path / "model"
    folder.mkdir()
    save_file({"w": torch.zeros(2)}, str(folder / "shard-1.safetensors"))
    (folder / "link.safetensors").symlink_to(tmp_path / "outside.safetensors")
    for bad in ("../outside.safetensors", str(tmp_path / "outside.safetensors"), "link.safetensors"):
        _shards(folder, {"w": bad})
        with pytest.raises(ValueError, match=r"model\.safetensors\.index\.json, field 'weight_map'.*outside"):
            load_state_dict(folder)
    _shards(folder, {"w": "shard-1.safetensors"})
    assert index_shards(folder) == [folder / "shard-1.safetensors"]
    assert load_state_dict(folder)["w"].tolist() == [0.0, 0.0]  # the inside shard, not the outside one


@pytest.mark.parametrize("content, field", [
    ('{"metadata": {}}', "field 'weight_map' is missing"),
    ('{"weight_map": ["a"]}', "field 'weight_map' is missing"),
    ('{"weight_map": {"w": 3}}', "3 is not a file name"),
    ('{"weight_map": {"w": "nope.safetensors"}}', "'nope.safetensors' does not exist"),
    ('{"weight_map": {"w": "shard-1.safetensors", "v": "shard-1.safetensors"}}', "lists 'v'"),
    ("[1, 2]", "expected a JSON object"),
    ("{not json", "not valid JSON"),
    (b"\xff\xfe{}", "not valid JSON"),
])
def test_a_malformed_index_names_the_file_and_the_field(tmp_path, content, field):
    folder = tmp_path / "model"
    folder.mkdir()
    save_file({"w": torch.zeros(2)}, str(folder / "shard-1.safetensors"))
    index = folder / "model.safetensors.index.json"
    index.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ValueError, match=field) as info:
        load_state_dict(folder)
    assert str(index) in str(info.value)


def test_a_malformed_config_names_the_file(tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{broken")
    with pytest.raises(ValueError, match=f"source base: {folder}/config.json: not valid JSON"):
        load_model(str(folder), folder, role="source base")
    (folder / "config.json").write_text(json.dumps(_bert_config()))
    with pytest.raises(ValueError, match="--hf-class='pipeline' is not a model class"):
        load_model(str(folder), folder, hf_class="pipeline", role="source base")


def test_load_model_behaves_as_the_command_did(tmp_path):
    """Same model and weights as building the class by hand; a checkpoint that does not fit is named."""
    folder = tmp_path / "hf"
    folder.mkdir()
    cfg = transformers.BertConfig(**_bert_config())
    cfg.save_pretrained(folder)
    torch.manual_seed(0)
    ref = transformers.BertForSequenceClassification(cfg)
    save_file(ref.state_dict(), str(folder / "model.safetensors"))
    got = load_model(None, folder, hf_class="BertForSequenceClassification", role="source base")
    assert not got.training and all(torch.equal(ref.state_dict()[k], v) for k, v in got.state_dict().items())
    (tmp_path / "m.py").write_text("import torch\ndef small():\n    return torch.nn.Linear(3, 2)\n"
                                   "def wrong():\n    return 'not a model'\n"
                                   "def meta():\n    return torch.nn.Linear(3, 2, device='meta')\n"
                                   "def bn():\n    return torch.nn.BatchNorm1d(3, device='meta')\n")
    save_file({"weight": torch.ones(2, 3), "bias": torch.zeros(2)}, str(tmp_path / "lin.safetensors"))
    lin = load_model(f"{tmp_path}/m.py:small", tmp_path / "lin.safetensors", role="target base")
    assert torch.equal(lin.weight, torch.ones(2, 3))
    with pytest.raises(ValueError, match="target base: the architecture factory returned str"):
        load_model(f"{tmp_path}/m.py:wrong", tmp_path / "lin.safetensors", role="target base")
    save_file({"weight": torch.ones(2, 4), "bias": torch.zeros(2)}, str(tmp_path / "wide.safetensors"))
    with pytest.raises(ValueError, match=r"target base: 'weight' has shape \(2, 4\) in the checkpoint"):
        load_model(f"{tmp_path}/m.py:small", tmp_path / "wide.safetensors", role="target base")
    with pytest.raises(ValueError, match="is not a Hugging Face folder; give its architecture with --target-arch"):
        load_model(None, tmp_path / "lin.safetensors", role="target base")
    save_file({"weight": torch.ones(2, 3)}, str(tmp_path / "nobias.safetensors"))
    with pytest.raises(ValueError, match="target base: .*missing \\['bias'\\]"):
        load_model(f"{tmp_path}/m.py:meta", tmp_path / "nobias.safetensors", role="target base")
    on_meta = load_model(f"{tmp_path}/m.py:meta", tmp_path / "lin.safetensors", role="target base")
    assert not on_meta.weight.is_meta and torch.equal(on_meta.weight, torch.ones(2, 3))  # built on meta, then filled
    save_file({"weight": torch.ones(3), "bias": torch.zeros(3)}, str(tmp_path / "bn.safetensors"))
    with pytest.raises(ValueError, match="'running_mean' is on the meta device"):
        load_model(f"{tmp_path}/m.py:bn", tmp_path / "bn.safetensors", role="target base")


def test_calibration_files_and_factories(tmp_path):
    save_file({"x": torch.randn(10, 3), "y": torch.arange(10)}, str(tmp_path / "cal.safetensors"))
    batches = load_batches(str(tmp_path / "cal.safetensors"), 4)
    assert [len(b["x"]) for b in batches] == [4, 4, 2] and torch.equal(torch.cat([b["y"] for b in batches]),
                                                                        torch.arange(10))
    assert len(load_batches(str(tmp_path / "cal.safetensors"), 4, 2)) == 2
    save_file({"x": torch.randn(10, 3), "t": torch.tensor(1.0)}, str(tmp_path / "scalar.safetensors"))
    with pytest.raises(ValueError, match="tensor 't' is a scalar"):
        load_batches(str(tmp_path / "scalar.safetensors"), 4)
    save_file({"x": torch.randn(10, 3), "y": torch.arange(9)}, str(tmp_path / "ragged.safetensors"))
    with pytest.raises(ValueError, match=r"differ in their first dimension \(\[9, 10\]\)"):
        load_batches(str(tmp_path / "ragged.safetensors"), 4)
    (tmp_path / "f.py").write_text("def batches():\n    yield 1\n    raise KeyError('row 7')\n"
                                   "def forever():\n    while True:\n        yield 0\n")
    with pytest.raises(UserCodeError, match=r"--data .*f\.py:batches: the calibration factory: KeyError: 'row 7' "
                                            r"\(at .*f\.py:3, in batches\)"):
        load_batches(f"{tmp_path}/f.py:batches", 4)
    assert load_batches(f"{tmp_path}/f.py:forever", 4, 3) == [0, 0, 0]  # an endless factory, cut at max_batches


@pytest.mark.parametrize("name", ["empty.pt", "empty.safetensors"])
def test_an_empty_checkpoint_is_named_with_a_reason(tmp_path, name):
    from ftlab.transfer.io import check_checkpoint

    (tmp_path / name).write_bytes(b"")
    for read in (load_state_dict, check_checkpoint):
        with pytest.raises(ValueError) as err:
            read(tmp_path / name)
        msg = str(err.value)
        assert name in msg and "\n" not in msg and not msg.rstrip().endswith(":"), msg
