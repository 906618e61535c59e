"""The benchmark's fingerprints: what a resumed sweep store and a later summary depend on.

A run's points are keyed by the sha1 of the point function's name and the point's parameters, the configuration's
flat dict among them (:func:`ftlab.core.sweep.point_key`). ``fingerprints/design.json`` holds the flat dicts of
:func:`full_config` and :func:`quick_config` and the keys of every point of both, and ``fingerprints/tiny_rows.json``
the records of two seconds-long runs, all captured from the driver as it stood before it was split into design /
set-up / run modules. A change of these means a resumed store recomputes its points, or a summary reads other
numbers than the run recorded.

Regenerate (only on purpose, when a design is meant to change): ``FTLAB_WRITE_FINGERPRINTS=1 pytest
tests/experiments/transfer_accuracy/test_fingerprints.py`` writes the files instead of comparing.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from ftlab.core.results import to_jsonable
from ftlab.core.sweep import point_key
from ftlab.experiments.transfer_accuracy import family
from ftlab.experiments.transfer_accuracy.run import (
    BenchmarkConfig,
    benchmark_point,
    full_config,
    quick_config,
    run_benchmark,
    tiny_config,
)

HERE = Path(__file__).resolve().parent / "fingerprints"
DESIGN = HERE / "design.json"
ROWS = HERE / "tiny_rows.json"
WRITE = os.environ.get("FTLAB_WRITE_FINGERPRINTS") == "1"

TINY_FAMILY = {
    "tiny-src": family.BaseSpec("tiny-src", width=8, depth=2, heads=2, n_per_source=32, epochs=1, batch_size=32),
    "tiny-perm": family.BaseSpec("tiny-perm", width=8, depth=2, heads=2, n_per_source=32, seed=9, parent="tiny-src",
                                 epochs=0, permute_seed=9),
    "tiny-wide": family.BaseSpec("tiny-wide", width=12, depth=3, heads=2, n_per_source=32, seed=3, epochs=1,
                                 batch_size=32),
}
TINY_SETTINGS = {"permuted": ("tiny-src", "tiny-perm"), "width": ("tiny-src", "tiny-wide")}
#: Two tiny runs: the default tiny design on an equal-shape and a wider target (ablations, TransFusion), and one with
#: both calibration sets, the diagnostic's estimate and ftlab's variants (shared fits, copy rules, repair).
TINY_RUNS: dict[str, dict] = {
    "default": {"family_settings": ("permuted", "width")},
    "variants": {"family_settings": ("width",), "methods": ("naive", "bico", "recommended", "recommended/first",
                                                            "bico+repair"),
                 "calibrations": ("n100", "k5"), "diagnose": True, "alpha_grid": (0.0, 0.5, 1.0, 2.0)},
}


def _json(obj):
    """The JSON form a sweep store holds (tuples as lists, non-finite floats as null)."""
    return json.loads(json.dumps(to_jsonable(obj), sort_keys=True))


def design_fingerprint() -> dict:
    out = {}
    for name, cfg in (("full", full_config()), ("quick", quick_config())):
        points = cfg.points()
        for p in points:
            p["cache"] = None
        out[name] = {"config": _json(cfg.to_dict()), "point_keys": [point_key(benchmark_point, p) for p in points]}
    return out


def tiny_rows(tmp: Path) -> dict[str, list[dict]]:
    """The records of :data:`TINY_RUNS` (``seconds`` left out: wall time), sorted for comparison."""
    out = {}
    for name, overrides in TINY_RUNS.items():
        df = run_benchmark(tiny_config(**overrides), store=tmp / f"{name}.jsonl", cache=tmp / "cache", workers=1)
        rows = _json(df.drop(columns=["seconds"]).to_dict(orient="records"))
        rows = [{k: v for k, v in r.items() if v is not None} for r in rows]  # columns other records fill
        out[name] = sorted(rows, key=lambda r: json.dumps(r, sort_keys=True))
    return out


def _same(got, want, path="") -> list[str]:
    """Where ``got`` differs from ``want``: accuracies (and every other string, int or bool) exactly, other floats
    to 1e-9 relative (alignment statistics are sums of float products whose order a BLAS may change)."""
    if isinstance(want, dict) and isinstance(got, dict):
        if set(got) != set(want):
            return [f"{path}: keys {sorted(set(got) ^ set(want))}"]
        return [d for k in want for d in _same(got[k], want[k], f"{path}.{k}")]
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{path}: {len(got)} items, recorded {len(want)}"]
        return [d for i, (g, w) in enumerate(zip(got, want)) for d in _same(g, w, f"{path}[{i}]")]
    exact = path.endswith(("accuracy", "val_accuracy", "alpha")) or not isinstance(want, float)
    if exact and got != want:
        return [f"{path}: {got!r} != recorded {want!r}"]
    # 1e-5: the runs compute in float32, and another CPU (its BLAS kernels) moves these figures by ~1e-8
    if not exact and not (isinstance(got, (int, float)) and math.isclose(got, want, rel_tol=1e-5, abs_tol=1e-9)):
        return [f"{path}: {got!r} != recorded {want!r}"]
    return []


def _recorded(path: Path, got):
    if WRITE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    return json.loads(path.read_text())


def test_full_and_quick_designs_keep_their_flat_dicts_and_point_keys():
    got = design_fingerprint()
    want = _recorded(DESIGN, got)
    for name in ("full", "quick"):
        assert got[name]["config"] == want[name]["config"], name
        # the key of every point a resumed store looks up: equal keys, the store's points are found again
        assert got[name]["point_keys"] == want[name]["point_keys"], name
    # and the stored dict reads back as the same configuration
    assert BenchmarkConfig.from_dict(want["full"]["config"]) == full_config()
    assert BenchmarkConfig.from_dict(want["quick"]["config"]) == quick_config()


@pytest.fixture
def tiny_family(monkeypatch, tiny_images):
    monkeypatch.setattr(family, "FAMILY", TINY_FAMILY)
    monkeypatch.setattr(family, "SETTINGS", TINY_SETTINGS)


def _canonical(rows: list) -> list:
    """Rows in a canonical order: rows that tie on the run's sort key may come in either order on another CPU."""
    return sorted(rows, key=lambda r: json.dumps({k: v for k, v in r.items() if not isinstance(v, float)},
                                                 sort_keys=True, default=str))


def test_tiny_runs_give_the_rows_recorded_before_the_split(tmp_path, tiny_family):
    got = tiny_rows(tmp_path)
    want = _recorded(ROWS, got)
    assert set(got) == set(want)
    for name in want:
        assert {r["record"] for r in want[name]} >= {"accuracy", "layer", "mechanism"}
        diffs = _same(_canonical(got[name]), _canonical(want[name]), name)
        assert diffs == [], "\n".join(diffs[:10])
