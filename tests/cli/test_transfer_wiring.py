"""`ftlab transfer` once wired to ftlab.transfer.io, ftlab.core.usercode and check_output_place: inputs are
data, never overwritten, and errors blame the right party (one line, exit 2)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import save_file  # noqa: E402

from ftlab.cli.main import main  # noqa: E402

EVIL = "from pathlib import Path\nPath({marker!r}).write_text('ran')\nfrom transformers import BertConfig\n" \
       "class EvilConfig(BertConfig):\n    model_type = 'evil-bert'\n"


def _cli(capsys, *args) -> tuple[int, list[str]]:
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    stage_line = re.compile(r"ftlab: .*: (started|done in .*|stopped after .*|\d+(/\d+)? after .*)$")
    err = [ln for ln in capsys.readouterr().err.splitlines() if not stage_line.match(ln)]
    return code, err


def _bert(folder: Path, width: int = 8, **extra) -> None:
    cfg = transformers.BertConfig(vocab_size=30, hidden_size=width, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=16, max_position_embeddings=16, num_labels=2)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({**cfg.to_dict(), **extra}))
    save_file(transformers.BertForSequenceClassification(cfg).state_dict(), str(folder / "model.safetensors"))


@pytest.fixture
def plain(tmp_path, monkeypatch):
    """Plain models from a factory file and tensor calibration data, in the current folder."""
    monkeypatch.chdir(tmp_path)
    Path("m.py").write_text("import torch\ndef a():\n    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(),"
                            " torch.nn.Linear(6, 3))\ndef loss(model, batch):\n    return torch.nn.functional."
                            "cross_entropy(model(batch['x']), batch['y'])\n")
    net = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))
    for name in ("a", "a_ft", "b"):
        save_file({k: v + (0.1 if name == "a_ft" else 0) for k, v in net.state_dict().items()}, f"{name}.safetensors")
    save_file({"x": torch.randn(8, 4), "y": torch.randint(0, 3, (8,))}, "cal.safetensors")
    return ["--source-base", "a.safetensors", "--source-finetuned", "a_ft.safetensors", "--target-base", "b.safetensors",
            "--source-arch", "m.py:a", "--target-arch", "m.py:a", "--data", "cal.safetensors", "--loss", "m.py:loss"]


def test_an_out_that_holds_an_input_is_refused_before_any_work(plain, capsys):
    before = Path("b.safetensors").read_bytes()
    code, err = _cli(capsys, "transfer", *plain, "--out", ".")
    assert code == 2 and len(err) == 1 and "contains the input --source-base" in err[0], err
    assert Path("b.safetensors").read_bytes() == before and not Path(".ftlab.lock").exists()
    assert sorted(p.name for p in Path(".").iterdir()) == ["a.safetensors", "a_ft.safetensors", "b.safetensors",
                                                          "cal.safetensors", "m.py"]


def test_a_hugging_face_input_folder_is_not_an_output(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("A", "A_ft", "B"):
        _bert(tmp_path / name)
    save_file({"input_ids": torch.randint(0, 30, (4, 6)), "labels": torch.tensor([0, 1, 0, 1])}, "cal.safetensors")
    weights = (tmp_path / "B" / "model.safetensors").read_bytes()
    for out, how in (("B/out", "lies inside the input --target-base"), ("B", "is the input --target-base")):
        code, err = _cli(capsys, "transfer", "--source-base", "A", "--source-finetuned", "A_ft", "--target-base", "B",
                         "--hf-class", "BertForSequenceClassification", "--data", "cal.safetensors", "--loss", "hf",
                         "--out", out)
        assert code == 2 and len(err) == 1 and how in err[0], err
    assert (tmp_path / "B" / "model.safetensors").read_bytes() == weights and not (tmp_path / "B" / "out").exists()


def test_a_folders_code_runs_only_with_trust_remote_code(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "marker"
    for name in ("A", "A_ft", "B"):
        _bert(tmp_path / name, model_type="evil-bert", auto_map={"AutoConfig": "evil.EvilConfig"})
        (tmp_path / name / "evil.py").write_text(EVIL.format(marker=str(marker)))
    args = ["transfer", "--source-base", "A", "--source-finetuned", "A_ft", "--target-base", "B", "--method", "naive",
            "--out", "out"]
    code, err = _cli(capsys, *args)
    assert code == 2 and "auto_map" in err[0] and "--trust-remote-code" in err[0] and not marker.exists()
    _cli(capsys, *args, "--trust-remote-code")
    assert marker.exists()  # the same folder, asked for: its code ran (so the refusal above was the check's)


def test_the_users_model_and_batch_are_named(tmp_path, capsys, monkeypatch):
    """A Hugging Face target narrower than its calibration data: exit 2 naming the model and batch."""
    monkeypatch.chdir(tmp_path)
    for name in ("A", "A_ft"):
        _bert(tmp_path / name)
    _bert(tmp_path / "B")
    save_file({"input_ids": torch.randint(0, 30, (4, 6)), "labels": torch.tensor([0, 1, 5, 1])}, "cal.safetensors")
    code, err = _cli(capsys, "transfer", "--source-base", "A", "--source-finetuned", "A_ft", "--target-base", "B",
                     "--hf-class", "BertForSequenceClassification", "--data", "cal.safetensors", "--loss", "hf",
                     "--out", "out")
    assert code == 2 and len(err) == 1 and err[0].startswith("ftlab: error: source model, calibration batch 0: "), err
    assert "internal error" not in err[0] and not Path("out").exists()


def test_loss_hf_on_a_plain_model_and_a_huge_alpha_are_one_line(plain, capsys):
    args = [a if a != "m.py:loss" else "hf" for a in plain]
    code, err = _cli(capsys, "transfer", *args, "--out", "out")
    assert code == 2 and len(err) == 1 and "--loss hf needs a Hugging Face model" in err[0], err
    code, err = _cli(capsys, "transfer", *plain, "--method", "naive", "--alpha", "1e300", "--out", "out")
    assert code == 2 and len(err) == 1 and "alpha=1e+300 is out of range for torch.float32 weights" in err[0], err


def test_the_python_api_names_a_model_on_the_meta_device():
    from ftlab.transfer import transfer

    with torch.device("meta"):
        meta = torch.nn.Linear(4, 3)
    real = torch.nn.Linear(4, 3)
    with pytest.raises(ValueError, match="target_base: 'weight' is on the meta device"):
        transfer(real, real, meta, [torch.randn(2, 4)], lambda m, b: m(b).sum(), method="naive")
    with pytest.raises(TypeError, match="loss"):
        transfer(real, real, real, [torch.randn(2, 4)], "m.py:loss", method="bico")
