"""`ftlab transfer` once wired to ftlab.transfer.io, ftlab.core.usercode and check_output_place: inputs are
data, never overwritten, and errors blame the right party (one line, exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import save_file  # noqa: E402

from ftlab.cli.main import main  # noqa: E402
from transfer_helpers import run_cli  # noqa: E402

EVIL = "from pathlib import Path\nPath({marker!r}).write_text('ran')\nfrom transformers import BertConfig\n" \
       "class EvilConfig(BertConfig):\n    model_type = 'evil-bert'\n"


def _cli(capsys, *args) -> tuple[int, list[str]]:
    code, _, err = run_cli(capsys, *args, stages=False)
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


def _permuted_target_and_rows(independent_target_rows: bool) -> list[str]:
    """Rewrite the ``plain`` folder: B a hidden-unit-permuted copy of A, 64 calibration rows for A and, when asked,
    64 other rows for B (``--target-data``) that share nothing with A's. Returns the extra arguments."""
    from safetensors.torch import load_file

    a = load_file("a.safetensors")
    perm = torch.randperm(6, generator=torch.Generator().manual_seed(0))
    b = {"0.weight": a["0.weight"][perm], "0.bias": a["0.bias"][perm], "2.weight": a["2.weight"][:, perm],
         "2.bias": a["2.bias"]}
    save_file(b, "b.safetensors")
    g = torch.Generator().manual_seed(1)
    save_file({"x": torch.randn(64, 4, generator=g), "y": torch.randint(0, 3, (64,), generator=g)}, "cal.safetensors")
    if not independent_target_rows:
        return []
    save_file({"x": torch.randn(64, 4, generator=g), "y": torch.randint(0, 3, (64,), generator=g)}, "cal_b.safetensors")
    return ["--target-data", "cal_b.safetensors"]


def _error_to_truth(out: str) -> float:
    """Relative error of the written tau_B against the true one (A's task vector, hidden units permuted as in B)."""
    from safetensors.torch import load_file

    a, a_ft, b = (load_file(f"{n}.safetensors") for n in ("a", "a_ft", "b"))
    tau = load_file(f"{out}/task_vector.safetensors")
    perm = torch.argsort(a["0.bias"]).index_select(0, torch.argsort(torch.argsort(b["0.bias"])))  # B's unit -> A's
    assert torch.equal(a["0.bias"][perm], b["0.bias"])
    truth = {"0.weight": (a_ft["0.weight"] - a["0.weight"])[perm], "0.bias": (a_ft["0.bias"] - a["0.bias"])[perm],
             "2.weight": (a_ft["2.weight"] - a["2.weight"])[:, perm], "2.bias": a_ft["2.bias"] - a["2.bias"]}
    num = sum(float((tau[k] - truth[k]).norm()) ** 2 for k in truth) ** 0.5
    return num / sum(float(v.norm()) ** 2 for v in truth.values()) ** 0.5


def test_a_permuted_copy_is_not_called_low_and_its_transfer_is_exact(plain, capsys):
    extra = _permuted_target_and_rows(independent_target_rows=False)
    code, err = _cli(capsys, "transfer", *plain, *extra, "--out", "out")
    said = [line for line in err if "estimated carried share" in line]
    assert code == 0 and len(said) == 1 and "1.00 >= 0.50" in said[0] and "low estimated" not in said[0], err
    assert "check the transfer against the target's own accuracy on held-out data" in said[0]
    assert _error_to_truth("out") < 1e-6
    rule = json.loads(Path("out/report.json").read_text())["diagnostic"]
    assert rule["estimate"] == pytest.approx(1.0, abs=1e-6) and rule["low_estimate"] is False
    assert rule["threshold"] == 0.5 and "ftlab's estimate" in rule["based_on"]


def test_a_useless_transfer_gets_a_low_estimate_note_before_writing_and_is_still_written(plain, capsys, monkeypatch):
    """B's calibration rows share nothing with A's: the fitted maps are arbitrary, the transfer is further from the
    true tau_B than no transfer at all, and the diagnostic read off the fit says so first (exit code unchanged)."""
    import ftlab.cli.transfer as cli_transfer

    extra = _permuted_target_and_rows(independent_target_rows=True)
    code, err = _cli(capsys, "transfer", *plain, *extra, "--out", "out")
    warned = [line for line in err if "estimated carried share" in line]
    assert code == 0 and len(warned) == 1 and warned[0].startswith(
        "ftlab transfer: note: low estimated carried share"), err
    assert "to try: more calibration data" in warned[0]
    assert _error_to_truth("out") > 1.0  # worse than transferring nothing: the low estimate was right here
    rule = json.loads(Path("out/report.json").read_text())["diagnostic"]
    assert rule["low_estimate"] is True and rule["estimate"] < 0.2 < rule["threshold"]
    assert f"{rule['estimate']:.2f} < 0.50" in warned[0]
    # before writing: a write that fails comes after the note, and nothing is written
    with monkeypatch.context() as mp:
        mp.setattr(cli_transfer, "write_full", lambda *a, **k: (_ for _ in ()).throw(ValueError("disk full")))
        code, err = _cli(capsys, "transfer", *plain, *extra, "--out", "out2")
    assert code == 2 and "low estimated carried share" in err[0] and "disk full" in err[-1], err
    assert not Path("out2").exists()
    # --diagnose says the same on stdout and in diagnosis.json
    main(["transfer", *plain, *extra, "--diagnose", "--out", "diag"])
    said = capsys.readouterr().out
    assert "note: low estimated carried share" in said
    diag = json.loads(Path("diag/diagnosis.json").read_text())["diagnostic"]
    assert diag["low_estimate"] is True and diag["estimate"] == pytest.approx(rule["estimate"], rel=1e-9)


def test_a_method_without_maps_records_no_diagnostic_and_transfusion_reads_both_loaded_bases(plain, capsys):
    extra = _permuted_target_and_rows(independent_target_rows=False)
    code, err = _cli(capsys, "transfer", *plain, *extra, "--method", "transfusion", "--out", "out")
    assert code == 0 and err == [], err
    assert json.loads(Path("out/report.json").read_text())["diagnostic"] is None
    assert _error_to_truth("out") < 1e-6  # the weight matching found B's permutation of A's hidden units


def test_an_empty_checkpoint_is_refused_saying_why(plain, capsys):
    Path("empty.pt").write_bytes(b"")
    args = list(plain)
    args[args.index("--source-base") + 1] = "empty.pt"
    code, out, err = run_cli(capsys, "transfer", *args, "--out", "out")
    assert code == 2 and out == "" and len(err) == 1, err
    assert "'empty.pt'" in err[0] and err[0].endswith("the file is empty (0 bytes)"), err
    assert not Path("out").exists()


def test_a_pickled_checkpoint_is_refused_in_one_line_before_any_stage(plain, capsys):
    import os

    torch.save({"0.weight": torch.zeros(6, 4), "hook": os.getcwd}, "pickled.pt")  # a pickle naming code to run
    args = list(plain)
    args[args.index("--target-base") + 1] = "pickled.pt"
    code, out, err = run_cli(capsys, "transfer", *args, "--out", "out")
    assert code == 2 and out == "" and len(err) == 1, err  # no "loading models: started / stopped" around it
    assert err[0].startswith("ftlab: error: refusing to unpickle 'pickled.pt'"), err
    assert not Path("out").exists()


def test_a_transfer_to_a_full_disk_leaves_no_output_folder(plain, capsys, monkeypatch, faults):
    """No byte left on the disk (names can be made, nothing written into a file): refused in one line, and the
    --out folder the run created is gone again, lock file included."""
    with monkeypatch.context() as m:
        faults.Injector(m, 1, "full")
        code, out, err = run_cli(capsys, "transfer", *plain, "--out", "out")
    assert code == 2 and out == "" and len(err) == 1 and "No space left on device" in err[0], err
    assert not Path("out").exists()
