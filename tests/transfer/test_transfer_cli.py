"""``ftlab transfer`` end to end on tiny random-config BERTs, and its bad-input contract."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from ftlab.cli.main import main

transformers = pytest.importorskip("transformers")
torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore::ftlab.transfer.align.RankWarning")


def bert(hidden, layers, inter, seed):
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=40, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
                                  intermediate_size=inter, max_position_embeddings=16, num_labels=3)
    return transformers.BertForSequenceClassification(cfg)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("bert")
    A = bert(16, 2, 32, 0)
    A.save_pretrained(root / "A")
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in A.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
    A.save_pretrained(root / "A_ft")
    bert(24, 3, 40, 2).save_pretrained(root / "B")
    g = torch.Generator().manual_seed(3)
    am = torch.ones(12, 10, dtype=torch.long)
    am[0, 6:] = 0
    save_file({"input_ids": torch.randint(0, 40, (12, 10), generator=g), "attention_mask": am,
               "labels": torch.randint(0, 3, (12,), generator=g)}, str(root / "cal.safetensors"))
    return root


def run(argv, capsys):
    """Exit code, stdout and stderr of a command that must exit; stage lines (progress) left out of stderr."""
    import re

    with pytest.raises(SystemExit) as exc:
        main(argv)
    out = capsys.readouterr()
    err = "".join(line for line in out.err.splitlines(keepends=True)
                  if not re.match(r"ftlab: .*: (started|done in .*|stopped after .*)$", line.strip()))
    return exc.value.code, out.out, err


def run_ok(argv, capsys) -> str:
    """Run a command that must succeed (click may or may not exit 0 explicitly); its stdout."""
    try:
        main(argv)
    except SystemExit as exc:
        assert exc.code in (0, None)
    return capsys.readouterr().out


def base_args(root, out):
    return ["transfer", "--source-base", str(root / "A"), "--source-finetuned", str(root / "A_ft"),
            "--target-base", str(root / "B"), "--hf-class", "BertForSequenceClassification",
            "--data", str(root / "cal.safetensors"), "--loss", "hf", "--batch-size", "4", "--out", str(out)]


def test_cli_end_to_end_tiny_bert(folders, tmp_path, capsys):
    from safetensors.torch import load_file

    from ftlab.transfer import TaskVector, fit_transfer

    out = tmp_path / "out"
    run_ok(base_args(folders, out) + ["--alpha", "0.7", "--diagnostics"], capsys)
    tv = load_file(str(out / "task_vector.safetensors"))
    weights = load_file(str(out / "model.safetensors"))
    base = load_file(str(folders / "B" / "model.safetensors"))
    # the written model is exactly B + alpha * tau_B, key for key
    for k, v in tv.items():
        assert torch.allclose(weights[k], base[k] + 0.7 * v, atol=1e-6)
    # the output folder is a loadable HF model of B's architecture
    loaded = transformers.BertForSequenceClassification.from_pretrained(out)
    assert loaded.config.hidden_size == 24
    # the CLI (files, subprocess-free) and the Python API agree on tau_B
    A = transformers.BertForSequenceClassification.from_pretrained(folders / "A")
    A_ft = transformers.BertForSequenceClassification.from_pretrained(folders / "A_ft")
    B = transformers.BertForSequenceClassification.from_pretrained(folders / "B")
    cal = load_file(str(folders / "cal.safetensors"))
    batches = [{k: v[i:i + 4] for k, v in cal.items()} for i in range(0, 12, 4)]
    api = fit_transfer(A, A_ft, B, batches, lambda m, b: m(**b).loss).task_vector
    assert set(api) == set(tv)
    diff = TaskVector({k: api[k] - tv[k] for k in api}).norm()
    assert diff < 1e-5 * api.norm()
    # the report: 2 -> 3 layers mapped in order; residual maps are 16 x 24; per-layer diagnostics present
    rep = json.loads((out / "report.json").read_text())
    assert rep["layer_map"] == {"bert.encoder.layer": [0, 1, 1]}
    q = next(r for r in rep["layers"] if r["target"] == "bert.encoder.layer.2.attention.self.query")
    assert q["source"] == "bert.encoder.layer.1.attention.self.query"
    assert q["in_map"] == [16, 24] and q["out_map"] == [16, 24]
    assert 0.0 <= q["in_cka"] <= 1.0 + 1e-9
    assert q["in_residual_fit"] <= q["in_residual_naive"] + 1e-9  # Procrustes is optimal among orthogonal maps
    assert rep["time_s"] > 0 and rep["peak_rss_mb"] > 0


def test_cli_refuses_pickled_checkpoint(folders, tmp_path, capsys):
    import os

    bad = tmp_path / "evil.pt"
    torch.save({"w": torch.zeros(2), "obj": os.getcwd}, bad)  # a pickle that references arbitrary code
    out = tmp_path / "out"
    args = base_args(folders, out)
    args[args.index("--target-base") + 1] = str(bad)
    args += ["--target-arch", str(folders / "B")]
    code, _, err = run(args, capsys)
    assert code == 2
    assert err.startswith("ftlab: error:") and "unpickle" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_cli_mismatched_architecture(folders, tmp_path, capsys):
    out = tmp_path / "out"
    args = base_args(folders, out)
    args[args.index("--source-finetuned") + 1] = str(folders / "B")  # a fine-tuned A that is not A-shaped
    code, _, err = run(args, capsys)
    assert code == 2 and "ftlab: error:" in err and not out.exists()


FACTORIES = textwrap.dedent('''
    import torch
    from torch import nn

    class Scale(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.gain = nn.Parameter(torch.ones(d))
        def forward(self, x):
            return x * self.gain

    def odd():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 6), Scale(6), nn.Linear(6, 2))

    def plain():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))

    def batches():
        g = torch.Generator().manual_seed(0)
        return [torch.randn(8, 4, generator=g) for _ in range(3)]

    def loss(model, x):
        return model(x).pow(2).mean()

    def nan_grad_loss(model, x):
        return torch.sqrt((model(x) * 0).abs()).sum()
''')


@pytest.fixture()
def factories(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "facts.py"
    path.write_text(FACTORIES)
    ns: dict = {}
    exec(FACTORIES, ns)
    for name in ("odd", "plain"):
        save_file({k: v.contiguous() for k, v in ns[name]().state_dict().items()}, str(tmp_path / f"{name}.safetensors"))
    return path


def factory_args(tmp_path, facts, arch, loss="loss"):
    ck = str(tmp_path / f"{arch}.safetensors")
    return ["transfer", "--source-base", ck, "--source-finetuned", ck, "--target-base", ck,
            "--source-arch", f"{facts}:{arch}", "--target-arch", f"{facts}:{arch}", "--data", f"{facts}:batches",
            "--loss", f"{facts}:{loss}", "--out", str(tmp_path / "out")]


def test_cli_unsupported_layer_is_named(factories, tmp_path, capsys):
    code, _, err = run(factory_args(tmp_path, factories, "odd"), capsys)
    assert code == 2 and "Scale" in err and "'1'" in err
    assert not (tmp_path / "out").exists()


def test_cli_non_finite_gradients(factories, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    # a task vector that is nonzero (a zero one needs no map, and no gradient is read for it)
    tuned = {k: v + 0.01 for k, v in load_file(str(tmp_path / "plain.safetensors")).items()}
    save_file(tuned, str(tmp_path / "tuned.safetensors"))
    args = factory_args(tmp_path, factories, "plain", loss="nan_grad_loss")
    args[args.index("--source-finetuned") + 1] = str(tmp_path / "tuned.safetensors")
    code, _, err = run(args, capsys)
    assert code == 2 and "non-finite gradient" in err
    assert not (tmp_path / "out").exists()


def test_cli_factory_path_works_and_zero_task_vector_stays_zero(factories, tmp_path, capsys):
    from safetensors.torch import load_file

    try:
        main(factory_args(tmp_path, factories, "plain"))
    except SystemExit as exc:
        assert exc.code in (0, None)
    tv = load_file(str(tmp_path / "out" / "task_vector.safetensors"))
    assert set(tv) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert all(float(v.abs().max()) == 0.0 for v in tv.values())  # A_ft == A: nothing to transfer


def test_cli_bad_option_values(folders, tmp_path, capsys):
    code, _, err = run(base_args(folders, tmp_path / "o") + ["-o", "whiten_p=0.9"], capsys)
    assert code == 2 and "whiten_p=0.9 is out of range" in err
    code, _, err = run(base_args(folders, tmp_path / "o")[:-4] + ["--loss", "nomodule_xyz:f", "--out", str(tmp_path / "o")],
                       capsys)
    assert code == 2 and "cannot import" in err


def test_cli_missing_keys(folders, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    state = load_file(str(folders / "A_ft" / "model.safetensors"))
    dropped = sorted(state)[3]
    del state[dropped]
    save_file(state, str(tmp_path / "partial.safetensors"))
    out = tmp_path / "out"
    args = base_args(folders, out)
    args[args.index("--source-finetuned") + 1] = str(tmp_path / "partial.safetensors")
    code, _, err = run(args + ["--source-arch", str(folders / "A")], capsys)
    assert code == 2 and "missing" in err and dropped in err and not out.exists()


def test_cli_diagnose_writes_the_diagnosis_and_no_model(folders, tmp_path, capsys):
    from safetensors.torch import load_file

    from ftlab.transfer import diagnose

    out = tmp_path / "diag"
    assert "carries over" in run_ok(base_args(folders, out) + ["--diagnose"], capsys)
    assert not (out / "model.safetensors").exists() and not (out / "task_vector.safetensors").exists()
    rep = json.loads((out / "diagnosis.json").read_text())
    assert 0.0 <= rep["estimate"] <= 1.0 + 1e-9
    q = next(r for r in rep["layers"] if r["target"] == "bert.encoder.layer.2.attention.self.query")
    assert q["in_dims"] == 16 and 0 <= q["in_rank"] <= 16 and q["out_statistic"] == "grad"
    # the CLI and the Python function agree
    A = transformers.BertForSequenceClassification.from_pretrained(folders / "A")
    A_ft = transformers.BertForSequenceClassification.from_pretrained(folders / "A_ft")
    B = transformers.BertForSequenceClassification.from_pretrained(folders / "B")
    cal = load_file(str(folders / "cal.safetensors"))
    batches = [{k: v[i:i + 4] for k, v in cal.items()} for i in range(0, 12, 4)]
    d = diagnose(A, A_ft, B, batches, lambda m, b: m(**b).loss)
    assert d.estimate == pytest.approx(rep["estimate"], rel=1e-6)
    # a method that fits no maps cannot be diagnosed
    code, _, err = run(base_args(folders, tmp_path / "d2") + ["--diagnose", "--method", "naive"], capsys)
    assert code == 2 and "--diagnose needs a method that fits maps" in err


def test_cli_full_disk_on_the_last_file_leaves_the_previous_output_intact(folders, tmp_path, capsys, monkeypatch):
    import errno

    import ftlab.core.results as results

    out = tmp_path / "out"
    run_ok(base_args(folders, out) + ["--method", "naive"], capsys)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert {"model.safetensors", "task_vector.safetensors", "report.json"} <= set(before)

    real = results.save_json

    def full_disk(path, obj, *a, **k):  # the report is written last: every other file is already staged
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(results, "save_json", full_disk)
    code, _, err = run(base_args(folders, out) + ["--method", "naive", "--alpha", "0.5"], capsys)
    monkeypatch.setattr(results, "save_json", real)
    assert code == 2 and "No space left" in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing new, nothing damaged
    assert [p.name for p in tmp_path.iterdir() if "staging" in p.name] == []


def test_cli_refuses_a_second_run_on_the_same_out(folders, tmp_path, capsys):
    from ftlab.core.results import output_lock

    out = tmp_path / "out"
    with output_lock(out):  # another run holds --out
        code, _, err = run(base_args(folders, out) + ["--method", "naive"], capsys)
    assert code == 2 and "in use by another ftlab run" in err
    assert not out.exists()


BN_FACTORIES = textwrap.dedent('''
    import torch
    from torch import nn

    def bn():
        torch.manual_seed(0)
        net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                            nn.Flatten(), nn.Linear(4, 2))
        return net.eval()

    def batches():
        g = torch.Generator().manual_seed(0)
        return [(torch.randn(6, 1, 5, 5, generator=g), torch.randint(0, 2, (6,), generator=g)) for _ in range(2)]

    def loss(model, batch):
        return nn.functional.cross_entropy(model(batch[0]), batch[1])
''')


@pytest.mark.parametrize("repair", ["mean_std", "none"])
def test_cli_full_output_carries_the_repaired_batchnorm_statistics(tmp_path, capsys, repair):
    import json

    from safetensors.torch import load_file, save_file

    facts = tmp_path / "bnfacts.py"
    facts.write_text(BN_FACTORIES)
    ns: dict = {}
    exec(BN_FACTORIES, ns)
    base = ns["bn"]()
    ft = ns["bn"]()
    with torch.no_grad():
        ft[0].bias.add_(1.0)  # a fine-tuning that shifts the channel means the BatchNorm reads
    save_file({k: v.contiguous() for k, v in base.state_dict().items()}, str(tmp_path / "a.safetensors"))
    save_file({k: v.contiguous() for k, v in ft.state_dict().items()}, str(tmp_path / "a_ft.safetensors"))
    arch = f"{facts}:bn"
    run_ok(["transfer", "--source-base", str(tmp_path / "a.safetensors"), "--source-finetuned",
            str(tmp_path / "a_ft.safetensors"), "--target-base", str(tmp_path / "a.safetensors"), "--source-arch", arch,
            "--target-arch", arch, "--data", f"{facts}:batches", "--loss", f"{facts}:loss", "--method", "naive",
            "--repair", repair, "--out", str(tmp_path / "out")], capsys)
    written = load_file(str(tmp_path / "out" / "model.safetensors"))
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["options"]["transfer"]["repair"] == repair
    shift = written["1.running_mean"] - base.state_dict()["1.running_mean"]
    if repair == "none":
        assert "repair" not in report and float(shift.abs().max()) == 0.0
    else:
        # the +1 shift of every channel is absorbed by the stored means: the written model computes what B computed
        assert set(report["repair"]["layers"]) == {"1"}
        torch.testing.assert_close(shift, torch.ones(4), rtol=1e-5, atol=1e-5)
