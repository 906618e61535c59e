"""``ftlab theory metrics`` / ``simulate``: records, formats, and the one-line error contract."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pandas as pd
import pytest
from click.testing import CliRunner

from ftlab.cli.main import cli
from ftlab.dln import metrics as dln_metrics


def _run(*args):
    res = CliRunner().invoke(cli, ["theory", *args], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.stdout  # stage lines go to stderr


def test_metrics_json_records_agree_with_the_api():
    out = json.loads(_run("metrics", "--c", "1e-3", "--lam", "-0.99", "--lam", "0", "--gamma", "0", "--format", "json"))
    assert len(out) == 2
    for rec in out:
        m = dln_metrics(beta_pt=rec["beta_pt"], beta_ft=rec["beta_ft"], c=rec["c"], lam=rec["lam"], gamma=rec["gamma"])
        assert rec["l_order"] == pytest.approx(m.l_order) and rec["pd"] == pytest.approx(m.pd)
        assert rec["regime"] == m.regime
    assert [r["regime"] for r in out] == ["IV", "II"]


def test_simulate_csv_has_inputs_and_outputs():
    out = _run("simulate", "--alpha", "0.2", "--alpha", "0.4", "--seeds", "2", "--dim", "80", "--overlap", "0.5",
               "--format", "csv")
    df = pd.read_csv(io.StringIO(out))
    assert len(df) == 4
    for key in ("c", "lam", "gamma", "rho_pt", "rho_ft", "overlap", "alpha_pt", "alpha", "dim", "noise", "error",
                "l_order", "pd", "regime", "converged"):
        assert key in df.columns
    assert df["converged"].all() and (df["distance"] < 1e-6).all()
    assert (df.groupby("alpha")["error"].mean().diff().dropna() < 0).all()  # more FT data, lower error


def test_simulate_conditional_parametrization():
    out = json.loads(_run("simulate", "--rho-shared", "0.5", "--rho-new", "0.05", "--dim", "60", "--format", "json"))
    assert out[0]["rho_ft"] == pytest.approx(0.1 * 0.5 + 0.9 * 0.05)


@pytest.mark.parametrize("args, fragment", [
    (["metrics", "--c", "0"], "c=0.0 is out of range"),
    (["metrics", "--lam", "1.5"], "lam=1.5 is out of range: must be in [-1, 1]"),
    (["metrics", "--gamma", "-1"], "gamma=-1.0 is out of range"),
    (["metrics", "--beta-ft", "nan"], "beta_ft"),
    (["simulate", "--rho-pt", "1.5"], "rho_pt=1.5 is out of range"),
    (["simulate", "--rho-ft", "0.5", "--overlap", "0.9"], "overlap=0.9 is out of range: must be in [0, 0.2]"),
    (["simulate", "--alpha", "0"], "alpha=0.0 is out of range"),
    (["simulate", "--dim", "0"], "dim=0 is out of range"),
    (["simulate", "--alpha", "inf"], "alpha=inf is not finite"),
    (["simulate", "--rho-shared", "0.5"], "rho_shared/rho_new"),
])
def test_bad_input_is_one_line_exit_2(args, fragment):
    proc = subprocess.run([sys.executable, "-m", "ftlab.cli.main", "theory", *args], capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ftlab: error:") and fragment in lines[0]
    assert "Traceback" not in proc.stderr
