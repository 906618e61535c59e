"""`ftlab transfer --out-format lora` as a practitioner runs it: plain Hugging Face base folders (saved as
``BertModel`` / ``MPNetModel``) with a task class, a PEFT adapter whose classifier is in ``modules_to_save``,
texts with labels; alpha in the adapter, the new head independent of B's random draw, the short heal, the
``--help`` example for MiniLM -> MPNet run as written. Tiny models built from configs (nothing downloaded)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
from safetensors.torch import load_file  # noqa: E402

from transfer_helpers import run_cli  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")
WORDS = ["the", "cat", "dog", "runs", "sits", "a", "big", "small", "red", "blue", "bird", "sings", "on", "mat", "tree",
         "fast", "slow", "green", "fish", "swims"]
BERT_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _cli(capsys, *args) -> tuple[int, str, list[str]]:
    return run_cli(capsys, *args, stages=False)


def _bert_base(folder: Path, width: int, layers: int, seed: int) -> None:
    """A base folder as sentence-transformers packages hold it: BertModel weights, a WordPiece tokenizer."""
    folder.mkdir()
    (folder / "vocab.txt").write_text("\n".join(BERT_SPECIAL + WORDS) + "\n")
    transformers.BertTokenizerFast(vocab=str(folder / "vocab.txt")).save_pretrained(str(folder))
    cfg = transformers.BertConfig(vocab_size=len(BERT_SPECIAL) + len(WORDS), hidden_size=width,
                                  num_hidden_layers=layers, num_attention_heads=2, intermediate_size=2 * width,
                                  max_position_embeddings=32)
    torch.manual_seed(seed)
    transformers.BertModel(cfg).save_pretrained(str(folder))


def _mpnet_base(folder: Path, width: int, layers: int, seed: int) -> None:
    """An MPNet base folder: its vocabulary has four more special tokens in front and <mask> at the end."""
    folder.mkdir()
    vocab = ["<s>", "<pad>", "</s>", "<unk>"] + BERT_SPECIAL + WORDS + ["<mask>"]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    transformers.MPNetTokenizerFast(vocab=str(folder / "vocab.txt")).save_pretrained(str(folder))
    cfg = transformers.MPNetConfig(vocab_size=len(vocab), hidden_size=width, num_hidden_layers=layers,
                                   num_attention_heads=2, intermediate_size=2 * width, max_position_embeddings=34)
    torch.manual_seed(seed)
    transformers.MPNetModel(cfg).save_pretrained(str(folder))


def _texts(path: Path, n: int = 24, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        idx = torch.randint(0, len(WORDS), (5,), generator=g).tolist()
        rows.append({"text": " ".join(WORDS[j] for j in idx), "label": i % 3})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _adapter(base: Path, folder: Path, seed: int = 2) -> None:
    """A user's PEFT LoRA on query/value with the classifier in modules_to_save, moved off its start."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(base), num_labels=3)
    pm = peft.get_peft_model(model, peft.LoraConfig(r=2, lora_alpha=4, target_modules=["query", "value"],
                                                    modules_to_save=["classifier"]))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n or "modules_to_save" in n:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    pm.save_pretrained(str(folder))


@pytest.fixture
def folders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _bert_base(tmp_path / "minilm", 8, 2, 0)
    _bert_base(tmp_path / "wide", 12, 3, 1)
    _texts(tmp_path / "texts.jsonl")
    _adapter(tmp_path / "minilm", tmp_path / "minilm-lora")
    return tmp_path


def _run(capsys, *extra: str, target: str = "wide", out: str = "out") -> tuple[str, list[str]]:
    code, stdout, err = _cli(capsys, "transfer", "--source-base", "minilm", "--source-finetuned", "minilm-lora",
                             "--target-base", target, "--hf-class", "BertForSequenceClassification",
                             "--data", "texts.jsonl", "--seq-align", "mean", "--out", out, *extra)
    assert code == 0, err
    return stdout, err


def _factors(folder: str) -> dict[str, torch.Tensor]:
    return load_file(str(Path(folder) / "adapter_model.safetensors"))


def _module_deltas(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each LoRA module's B @ A (lora_alpha = r is checked: scaling 1)."""
    return {k[: -len(".lora_A.weight")]: state[k.replace("lora_A", "lora_B")] @ state[k]
            for k in state if k.endswith(".lora_A.weight")}


def test_plain_base_folders_go_in_and_alpha_scales_the_adapter_but_not_the_new_head(folders, capsys):
    _, err = _run(capsys, "--alpha", "1")
    _run(capsys, "--alpha", "0.5", out="half")
    cfg = json.loads(Path("out/adapter_config.json").read_text())
    assert cfg["lora_alpha"] == cfg["r"] and cfg["modules_to_save"] == ["classifier"]
    one, half = _factors("out"), _factors("half")
    d1, dh = _module_deltas(one), _module_deltas(half)
    assert d1 and set(d1) == set(dh)
    for k in d1:  # the transported encoder delta at alpha 0.5 is half of it at alpha 1
        torch.testing.assert_close(dh[k], 0.5 * d1[k], atol=1e-6, rtol=1e-5)
    assert max(float(v.abs().max()) for v in d1.values()) > 1e-3
    report = json.loads(Path("half/report.json").read_text())
    assert report["alpha"] == 0.5 and report["adapter"]["alpha"] == 0.5
    assert any("new head classifier refitted" in ln for ln in err), err


def test_the_written_adapter_does_not_depend_on_the_head_the_loader_draws_for_b(folders, capsys):
    """B's folder holds no head: the loader draws one from torch's generator. Two runs from different generator
    states write the same adapter (with heads='delta' they would not: the delta sits on the drawn head)."""
    outs = []
    for i, seed in enumerate((0, 123)):
        torch.manual_seed(seed)
        _run(capsys, out=f"o{i}")
        outs.append(_factors(f"o{i}"))
    assert set(outs[0]) == set(outs[1]) and any("classifier" in k for k in outs[0])
    for k in outs[0]:
        torch.testing.assert_close(outs[0][k], outs[1][k], atol=1e-6, rtol=0)
    for i, seed in enumerate((0, 123)):
        torch.manual_seed(seed)
        _run(capsys, "--heads", "delta", out=f"d{i}")
    delta = [_factors(f"d{i}") for i in range(2)]
    assert any(not torch.allclose(delta[0][k], delta[1][k]) for k in delta[0] if "classifier" in k) or \
        set(delta[0]) != set(outs[0])


def _calibration_loss(folder: str, target: str) -> float:
    """Mean cross-entropy of B + the adapter in ``folder`` on texts.jsonl (B's head as the adapter writes it)."""
    from ftlab.transfer.io import load_model

    tok = transformers.AutoTokenizer.from_pretrained(target)
    rows = [json.loads(ln) for ln in Path("texts.jsonl").read_text().splitlines()]
    enc = tok([r["text"] for r in rows], padding=True, return_tensors="pt")
    B = load_model(None, target, hf_class="BertForSequenceClassification", role="target base", num_labels=3)
    model = peft.PeftModel.from_pretrained(B, folder).eval()
    with torch.no_grad():
        return float(model(**enc, labels=torch.tensor([r["label"] for r in rows])).loss)


def test_the_heal_trains_the_written_adapter_and_lowers_its_calibration_loss(folders, capsys):
    _run(capsys, out="plain")
    _, err = _run(capsys, "--heal-steps", "20", "--heal-lr", "1e-2", out="healed")
    report = json.loads(Path("healed/report.json").read_text())
    assert report["adapter"]["heal"]["steps"] == 20
    before, after = _calibration_loss("plain", "wide"), _calibration_loss("healed", "wide")
    assert after < before - 1e-3, (before, after)
    code, _, err = _cli(capsys, "transfer", "--source-base", "minilm", "--source-finetuned", "minilm-lora",
                        "--target-base", "wide", "--hf-class", "BertForSequenceClassification", "--data",
                        "texts.jsonl", "--heal-steps", "5", "--out-format", "full", "--out", "bad")
    assert code == 2 and len(err) == 1 and "--heal-steps" in err[0] and not Path("bad").exists(), err


def test_with_head_data_the_heal_trains_on_its_rows_unless_told_otherwise(folders, capsys):
    """--heal-data auto heals on the --head-data rows when they are given (the report says which rows, and how many
    batches); --heal-data data heals on the calibration file; head-data without --head-data is refused."""
    _texts(Path("head.jsonl"), n=40, seed=5)
    _run(capsys, "--head-data", "head.jsonl", out="plain_h")
    _, err = _run(capsys, "--head-data", "head.jsonl", "--heal-steps", "20", "--heal-lr", "1e-2", out="healed_h")
    heal = json.loads(Path("healed_h/report.json").read_text())["adapter"]["heal"]
    assert (heal["data"], heal["batches"]) == ("head-data", 2)  # 40 rows in batches of 32
    assert any(not torch.equal(a, b) for a, b in zip(_factors("plain_h").values(), _factors("healed_h").values()))
    _run(capsys, "--head-data", "head.jsonl", "--heal-steps", "20", "--heal-lr", "1e-2", "--heal-data", "data",
         out="healed_d")
    heal = json.loads(Path("healed_d/report.json").read_text())["adapter"]["heal"]
    assert (heal["data"], heal["batches"]) == ("data", 1)  # the 24 calibration texts
    assert any(not torch.equal(a, b) for a, b in zip(_factors("healed_h").values(), _factors("healed_d").values()))
    code, _, err = _cli(capsys, "transfer", "--source-base", "minilm", "--source-finetuned", "minilm-lora",
                        "--target-base", "wide", "--hf-class", "BertForSequenceClassification", "--data",
                        "texts.jsonl", "--heal-steps", "5", "--heal-data", "head-data", "--out", "bad")
    assert code == 2 and len(err) == 1 and "--heal-data head-data" in err[0] and not Path("bad").exists(), err


def test_the_rank_note_names_what_to_do(folders, capsys):
    _, err = _run(capsys)
    notes = [ln for ln in err if "note:" in ln]
    assert notes, err
    assert all("--max-samples" in ln or "the completion rule does" in ln for ln in notes), notes


def test_the_minilm_to_mpnet_example_of_help_runs_as_written(folders, capsys):
    """The first example of `ftlab transfer --help`, with its folder names, on tiny folders: the name map, the
    relative-bias zeros and the vocabulary map are found by ftlab; the adapter loads onto MPNet with PEFT."""
    _mpnet_base(folders / "mpnet", 12, 2, 3)
    code, stdout, _ = _cli(capsys, "transfer", "--help")
    text = re.sub(r"\\\s*\n\s*", " ", stdout)
    line = next(ln for ln in text.splitlines() if "--target-base mpnet" in ln)
    argv = line.split("ftlab transfer", 1)[1].split()
    code, stdout, err = _cli(capsys, "transfer", *argv)
    assert code == 0, err
    from ftlab.transfer.io import load_model

    B = load_model(None, "mpnet", hf_class="AutoModelForSequenceClassification", role="target base", num_labels=3)
    model = peft.PeftModel.from_pretrained(copy.deepcopy(B), "out").eval()
    ids = transformers.AutoTokenizer.from_pretrained("mpnet")(["the cat runs"], return_tensors="pt")
    with torch.no_grad():
        moved = model(**ids).logits
    assert moved.shape == (1, 3) and torch.isfinite(moved).all()
    deltas = _module_deltas(_factors("out"))
    assert any("mpnet.encoder.layer" in k for k in deltas) and max(float(v.abs().max()) for v in deltas.values()) > 0


def test_the_heal_refuses_an_adapter_folder_holding_only_a_pickle(folders):
    """peft would unpickle an adapter_model.bin; heal_adapter reads safetensors only and says so in one line."""
    from ftlab.transfer.heal import HealRecipe, heal_adapter

    pickled = Path("pickled")
    pickled.mkdir()
    (pickled / "adapter_config.json").write_text((folders / "minilm-lora" / "adapter_config.json").read_text())
    torch.save(_factors(str(folders / "minilm-lora")), pickled / "adapter_model.bin")
    before = sorted(p.name for p in pickled.iterdir())
    model = transformers.AutoModelForSequenceClassification.from_pretrained("minilm", num_labels=3)
    with pytest.raises(ValueError, match="no adapter_model.safetensors") as exc:
        heal_adapter(model, pickled, [{"input_ids": torch.zeros(1, 3, dtype=torch.long)}], lambda m, b: 0.0,
                     HealRecipe(steps=1))
    assert "\n" not in str(exc.value) and sorted(p.name for p in pickled.iterdir()) == before


def test_the_naive_baseline_carries_a_bert_adapter_to_mpnet_with_the_relative_bias_left_alone(folders, capsys):
    """The --help example with --method naive: MPNet's relative attention bias has no counterpart in a BERT source;
    ftlab's automatic zero_params give it a zero delta in every method (the copy methods raised before), and the
    modules the source adapter touches get the source's delta padded into their leading block."""
    _mpnet_base(folders / "mpnet", 12, 2, 3)
    _, stdout, _ = _cli(capsys, "transfer", "--help")
    text = re.sub(r"\\\s*\n\s*", " ", stdout)
    argv = next(ln for ln in text.splitlines() if "--target-base mpnet" in ln).split("ftlab transfer", 1)[1].split()
    code, _, err = _cli(capsys, "transfer", *argv[:-1], "naive", "--method", "naive")
    assert code == 0, err
    deltas = _module_deltas(_factors("naive"))
    assert not any("relative_attention_bias" in k for k in _factors("naive"))
    src = _module_deltas(_factors(str(folders / "minilm-lora")))
    q0 = next(k for k in deltas if k.endswith("mpnet.encoder.layer.0.attention.attn.q"))
    s0 = next(k for k in src if k.endswith("bert.encoder.layer.0.attention.self.query"))
    torch.testing.assert_close(deltas[q0][: src[s0].shape[0], : src[s0].shape[1]], src[s0] * 2, atol=1e-5, rtol=1e-4)


def test_alpha_zero_writes_the_new_head_alone_as_an_adapter_peft_loads(folders, capsys):
    """At --alpha 0 the encoder delta is zero and only the refitted head remains; PEFT loads no adapter without a LoRA
    module, so ftlab writes one zero LoRA beside the head: the merged encoder is B's own, the head the written one."""
    _run(capsys, "--alpha", "0", out="zero")
    cfg = json.loads(Path("zero/adapter_config.json").read_text())
    assert len(cfg["target_modules"]) == 1 and cfg["modules_to_save"] == ["classifier"]
    from ftlab.transfer.io import load_model

    B = load_model(None, "wide", hf_class="BertForSequenceClassification", role="target base", num_labels=3)
    model = peft.PeftModel.from_pretrained(copy.deepcopy(B), "zero").eval()
    merged = model.merge_and_unload().state_dict()
    for k, v in B.state_dict().items():
        if not k.startswith("classifier."):
            torch.testing.assert_close(merged[k], v, atol=0, rtol=0)
    saved = _factors("zero")
    head = {k.rsplit(".", 1)[-1]: v for k, v in saved.items() if "classifier" in k}
    torch.testing.assert_close(merged["classifier.weight"], head["weight"], atol=0, rtol=0)
    assert all(float(v.abs().max()) == 0 for k, v in saved.items() if "lora_" in k)
