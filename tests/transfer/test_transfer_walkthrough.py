"""The walk-through of docs/transfer.md, run as written on tiny models built here, and the bad inputs of that path.

A LoRA adapter of a small BERT and a JSON-lines file of texts give, in two commands, a diagnosis and a LoRA
adapter for a wider BERT; the adapter merges into exactly the task vector the Python API computes.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
pytestmark = pytest.mark.filterwarnings("ignore::ftlab.transfer.align.RankWarning", "ignore::UserWarning")

ROOT = Path(__file__).resolve().parents[2]
WORDS = ["cat", "dog", "bird", "fish", "red", "blue", "green", "runs", "sleeps", "eats", "the", "a", "big", "small"]


def _tokenizer(folder: Path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = transformers.BertTokenizerFast(vocab=str(folder / "vocab.txt"))
    assert len(tok) == len(vocab)  # this transformers ignores vocab_file=: every text would become [UNK]
    tok.save_pretrained(str(folder))
    return tok


def _bert(folder: Path, width: int, seed: int):
    cfg = transformers.BertConfig(vocab_size=len(WORDS) + 5, hidden_size=width, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=2 * width, max_position_embeddings=32, num_labels=3)
    torch.manual_seed(seed)
    model = transformers.BertForSequenceClassification(cfg).eval()
    model.save_pretrained(str(folder))
    _tokenizer(folder)
    return model


@pytest.fixture
def practitioner(tmp_path, monkeypatch):
    """small-bert/, small-bert-lora/, wide-bert/ and texts.jsonl in an empty working folder."""
    monkeypatch.chdir(tmp_path)
    small = _bert(tmp_path / "small-bert", 16, 0)
    _bert(tmp_path / "wide-bert", 24, 1)
    pm = peft.get_peft_model(copy.deepcopy(small), peft.LoraConfig(r=2, lora_alpha=4, target_modules=["query", "value",
                                                                                                      "dense"]))
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    pm.save_pretrained(str(tmp_path / "small-bert-lora"))
    rng = torch.Generator().manual_seed(3)
    with open("texts.jsonl", "w") as fh:
        for i in range(48):
            words = [WORDS[int(j)] for j in torch.randint(0, len(WORDS), (6,), generator=rng)]
            fh.write(json.dumps({"text": " ".join(words), "label": i % 3}) + "\n")
    with open("train.jsonl", "w") as fh:
        for i in range(96):
            words = [WORDS[int(j)] for j in torch.randint(0, len(WORDS), (6,), generator=rng)]
            fh.write(json.dumps({"text": " ".join(words), "label": i % 3}) + "\n")
    return tmp_path


def _commands() -> list[list[str]]:
    text = (ROOT / "docs" / "transfer.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- walkthrough -->\n```bash\n(.*?)```", text, re.S)
    assert block, "docs/transfer.md has no walk-through block"
    joined = block.group(1).replace("\\\n", " ")
    return [shlex.split(line)[1:] for line in joined.splitlines() if line.strip().startswith("ftlab ")]


def _run(argv, capsys) -> tuple[int, str, str]:
    from ftlab.cli.main import main

    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_walkthrough_runs_as_written_and_the_adapter_merges_to_the_api_result(practitioner, capsys):
    cmds = _commands()
    assert len(cmds) == 2 and "--diagnose" in cmds[0]
    for argv in cmds:
        code, out, err = _run(argv, capsys)
        assert code == 0, err
    diag = json.loads(Path("diagnosis/diagnosis.json").read_text())
    assert 0.0 <= diag["estimate"] <= 1.0 and diag["layers"]
    out = Path("wide-bert-lora")
    names = {p.name for p in out.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "report.json", "vocab.txt"} <= names
    report = json.loads((out / "report.json").read_text())
    assert report["out_format"] == "lora" and report["adapter"]["rank"] <= 2
    assert all(m["truncation_error"] < 1e-6 for m in report["adapter"]["modules"].values())
    # the adapter loads with peft and merges into the task vector the Python API computes from the same inputs
    from ftlab.cli.transfer_inputs import hf_loss
    from ftlab.transfer import fit_transfer
    from ftlab.transfer.datafiles import load_tokenizer, text_batches

    A = transformers.BertForSequenceClassification.from_pretrained("small-bert").eval()
    B = transformers.BertForSequenceClassification.from_pretrained("wide-bert").eval()
    src, tgt = text_batches("texts.jsonl", [load_tokenizer("small-bert"), load_tokenizer("wide-bert")], batch_size=32)
    tau_b = fit_transfer(A, "small-bert-lora", B, loss=hf_loss, source_batches=src, target_batches=tgt).task_vector
    merged = peft.PeftModel.from_pretrained(copy.deepcopy(B), str(out)).merge_and_unload()
    for k, v in merged.state_dict().items():
        if k in tau_b:
            torch.testing.assert_close(v - B.state_dict()[k], tau_b[k].to(v.dtype), atol=1e-5, rtol=0, msg=k)
    assert tau_b.norm() > 0


def test_a_full_output_of_a_hugging_face_target_loads_with_its_tokenizer(practitioner, capsys):
    argv = _commands()[1]
    argv[argv.index("--out") + 1] = "wide-bert-ft"
    code, _, err = _run(argv + ["--out-format", "full"], capsys)
    assert code == 0, err
    model = transformers.AutoModelForSequenceClassification.from_pretrained("wide-bert-ft")
    tok = transformers.AutoTokenizer.from_pretrained("wide-bert-ft")
    assert model.config.hidden_size == 24 and tok("the cat runs")["input_ids"][0] == tok.cls_token_id


@pytest.mark.parametrize("case,match", [
    ("other_base", "targets module|shape"),
    ("ia3", "peft_type='IA3'"),
    ("no_column", "texts.jsonl: row 1 has no column 'label'"),
    ("float_label", "texts.jsonl: row 1: label column 'label' holds 0.5, not an integer"),
    ("empty", "texts.jsonl: holds no rows"),
    ("no_tokenizer", "no tokenizer ftlab can read"),
    ("no_classes", "no class folders"),
])
def test_bad_inputs_of_the_walkthrough_are_one_line_and_write_nothing(practitioner, capsys, case, match):
    argv = _commands()[1]
    if case == "other_base":  # an adapter made for the wide model, given as the small one's
        wide = transformers.BertForSequenceClassification.from_pretrained("wide-bert")
        pm = peft.get_peft_model(wide, peft.LoraConfig(r=2, target_modules=["query"]))
        pm.save_pretrained("wide-lora")
        argv[argv.index("--source-finetuned") + 1] = "wide-lora"
    elif case == "ia3":
        Path("small-bert-lora/adapter_config.json").write_text(json.dumps({"peft_type": "IA3"}))
    elif case == "no_column":
        Path("texts.jsonl").write_text('{"text": "the cat"}\n')
    elif case == "float_label":
        Path("texts.jsonl").write_text('{"text": "the cat", "label": 0.5}\n')
    elif case == "empty":
        Path("texts.jsonl").write_text("\n")
    elif case == "no_tokenizer":
        for f in Path("wide-bert").iterdir():
            if f.name not in ("config.json", "model.safetensors"):
                f.unlink()
    elif case == "no_classes":
        Path("images").mkdir()
        argv[argv.index("--data") + 1] = "images"
    capsys.readouterr()  # what setting the case up printed
    code, _, err = _run(argv, capsys)
    lines = [ln for ln in err.splitlines() if not re.match(r"ftlab: .*: (started|done in .*|stopped after .*)$", ln)]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("ftlab: error:"), err
    assert re.search(match, lines[0]), lines[0]
    assert not Path("wide-bert-lora").exists()


def _without(argv: list[str], flag: str) -> list[str]:
    i = argv.index(flag)
    return argv[:i] + argv[i + 2:]


def _with(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


def test_head_data_refits_the_new_head_on_its_rows_as_the_api_does(practitioner, capsys):
    small = transformers.BertForSequenceClassification.from_pretrained("small-bert").eval()
    pm = peft.get_peft_model(copy.deepcopy(small), peft.LoraConfig(r=2, target_modules=["query", "value"],
                                                                    modules_to_save=["classifier"]))
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n or "modules_to_save" in n:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    pm.save_pretrained("small-bert-cls")
    argv = _with(_commands()[1], "--source-finetuned", "small-bert-cls")
    assert "--head-data" in argv  # the walk-through's command, as written, with an adapter that has a new head
    code, _, err = _run(_with(argv, "--out", "with-head-data"), capsys)
    assert code == 0, err
    assert "refitted on 96 labelled head data rows" in err
    report = json.loads(Path("with-head-data/report.json").read_text())
    assert report["inputs"]["head_data"] == "train.jsonl" and report["heads"]["head_data"] is True
    from ftlab.cli.transfer_inputs import hf_loss
    from ftlab.transfer import fit_transfer
    from ftlab.transfer.datafiles import load_tokenizer, text_batches

    B = transformers.BertForSequenceClassification.from_pretrained("wide-bert").eval()
    toks = [load_tokenizer("small-bert"), load_tokenizer("wide-bert")]
    src, tgt = text_batches("texts.jsonl", toks, batch_size=32)
    _, head = text_batches("train.jsonl", toks, batch_size=32)
    res = fit_transfer(small, "small-bert-cls", B, loss=hf_loss, source_batches=src, target_batches=tgt,
                       head_batches=head)
    merged = peft.PeftModel.from_pretrained(copy.deepcopy(B), "with-head-data").merge_and_unload()
    torch.testing.assert_close(merged.classifier.weight, res.model(B).classifier.weight, atol=1e-5, rtol=0)
    # without --head-data the head is fitted on the 48 calibration rows: another head
    code, _, err = _run(_with(_without(argv, "--head-data"), "--out", "without"), capsys)
    assert code == 0 and "refitted on 48 labelled calibration rows" in err
    other = peft.PeftModel.from_pretrained(copy.deepcopy(B), "without").merge_and_unload()
    assert (other.classifier.weight - merged.classifier.weight).abs().max() > 1e-4
    # --head-data without --data, and a head-data file without rows: one line each, nothing written
    code, _, err = _run(_with(_without(argv, "--data"), "--out", "bad1"), capsys)
    assert code != 0 and "--head-data" in err and not Path("bad1").exists()
    Path("empty.jsonl").write_text("\n")
    code, _, err = _run(_with(_with(argv, "--head-data", "empty.jsonl"), "--out", "bad2"), capsys)
    assert code != 0 and "empty.jsonl" in err and not Path("bad2").exists()


def test_head_data_without_a_new_head_is_said_to_be_unused(practitioner, capsys):
    code, _, err = _run(_with(_commands()[1], "--out", "plain"), capsys)  # the adapter has no new head
    assert code == 0 and "--head-data is unused" in err
