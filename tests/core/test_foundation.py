"""Foundation: validation, atomic I/O, the resumable sweep runner, the CLI's error contract."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from ftlab.core.results import atomic_write_text, load_table, save_table
from ftlab.core.sweep import grid, read_store, run_sweep
from ftlab.core.validate import check_int, check_positive, check_range


def square(x, seed=0):
    return {"y": x * x + seed}


def two_records(x):
    return [{"which": "a", "y": x}, {"which": "b", "y": -x}]


CALLS = []


def counting(x):
    CALLS.append(x)
    if x == 3:
        raise RuntimeError("boom at 3")
    return {"y": 2 * x}


def test_checks_name_parameter_and_range():
    with pytest.raises(ValueError, match=r"^lam=1.5 is out of range: must be in \[-1, 1\]$"):
        check_range("lam", 1.5, -1, 1)
    with pytest.raises(ValueError, match="c=nan is not finite"):
        check_positive("c", float("nan"))
    with pytest.raises(ValueError, match="c=0 is out of range"):
        check_positive("c", 0)
    with pytest.raises(ValueError, match="dim=0"):
        check_int("dim", 0, 1)
    assert check_int("dim", 5.0, 1) == 5


def test_atomic_write_keeps_old_file_on_failure(tmp_path, monkeypatch):
    p = tmp_path / "a.txt"
    atomic_write_text(p, "old")
    import ftlab.core.results as R

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(R.os, "replace", broken_replace)
    with pytest.raises(OSError):
        atomic_write_text(p, "new")
    assert p.read_text() == "old"
    assert [f.name for f in tmp_path.iterdir()] == ["a.txt"]  # no temp file left behind


def test_save_table_roundtrip_with_sidecar(tmp_path):
    df = pd.DataFrame({"alpha": [0.1, 0.2], "error": [0.9, 0.8]})
    p = save_table(df, tmp_path / "t.csv", params={"c": 1e-3}, seed=7)
    back, meta = load_table(p)
    pd.testing.assert_frame_equal(back, df)
    assert meta["params"] == {"c": 1e-3} and meta["seed"] == 7 and meta["rows"] == 2


def test_grid_and_serial_sweep():
    pts = grid(x=[1, 2], seed=[0, 10])
    assert pts[1] == {"x": 1, "seed": 10}
    df = run_sweep(square, pts, workers=1)
    assert df["y"].tolist() == [1, 11, 4, 14]


def test_pool_sweep_equals_serial():
    pts = grid(x=range(6))
    a = run_sweep(square, pts, workers=1)
    b = run_sweep(square, pts, workers=2)
    pd.testing.assert_frame_equal(a, b)
    c = run_sweep(two_records, grid(x=[1, 2]), workers=1)
    assert c["which"].tolist() == ["a", "b", "a", "b"] and c["y"].tolist() == [1, -1, 2, -2]


def test_sweep_resumes_after_failure_and_truncated_line(tmp_path):
    store = tmp_path / "s.jsonl"
    CALLS.clear()
    with pytest.raises(RuntimeError, match="boom"):
        run_sweep(counting, grid(x=[1, 2, 3, 4]), store=store, workers=1)
    assert CALLS == [1, 2, 3]
    assert len(read_store(store)) == 2  # finished points were kept
    with open(store, "a") as fh:  # simulate a kill in the middle of a write
        fh.write('{"key": "trunc')
    CALLS.clear()
    df = run_sweep(counting, grid(x=[1, 2, 4]), store=store, workers=1)
    assert CALLS == [4]  # nothing finished was recomputed
    assert df["y"].tolist() == [2, 4, 8]
    lines = [json.loads(ln) for ln in store.read_text().splitlines() if ln.startswith('{"key": "') and ln.endswith("}")]
    assert len(lines) == 3


def test_sweep_rejects_duplicate_points():
    with pytest.raises(ValueError, match="not unique"):
        run_sweep(square, [{"x": 1}, {"x": 1}], workers=1)


def test_dask_local_cluster_matches_serial():
    distributed = pytest.importorskip("dask.distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cl:
        with distributed.Client(cl) as client:
            df = run_sweep(square, grid(x=range(4)), scheduler=client)
    assert np.allclose(df["y"], [0, 1, 4, 9])


def test_cli_bad_section_is_one_line_exit_2():
    r = subprocess.run([sys.executable, "-m", "ftlab.cli.main", "reproduce", "nope"], capture_output=True, text=True)
    assert r.returncode == 2
    assert "nope" in r.stderr and "Traceback" not in r.stderr
