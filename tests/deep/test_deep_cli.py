"""``ftlab deep``: geometry on saved arrays, claims from tables, one-line errors with exit 2."""

import io
import json

import numpy as np
import pandas as pd
import pytest

from ftlab.cli.main import main
from ftlab.core.geometry import ensd, linear_cka, participation_ratio


def _run(args, capsys):
    code = 0
    try:
        main(["deep", *args])
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_geometry_command_matches_library(tmp_path, capsys):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 6))
    Y = X @ rng.standard_normal((6, 6)) + 0.1 * rng.standard_normal((40, 6))
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", Y)
    code, out, _ = _run(["geometry", str(tmp_path / "x.npy"), str(tmp_path / "y.npy"), "--center", "--format", "json"],
                        capsys)
    assert code == 0
    rec = json.loads(out)[0]
    assert rec["pr_x"] == pytest.approx(participation_ratio(X, center=True))
    assert rec["ensd"] == pytest.approx(ensd(X, Y, center=True))
    assert rec["cka"] == pytest.approx(linear_cka(X, Y))


def test_claims_command_reads_saved_table(tmp_path, capsys):
    rows = [dict(seed=s, p=p, kind=k, when="post", b=b, ft_loss=0.005,
                 acc=0.5 + (0.1 if b < 0 else 0) + 0.01 * s + 0.001 * (s % 2) * (b < 0))
            for s in range(4) for p, k in ((3, "reuse"), (7, "new")) for b in (-0.5, 0.0, 0.5)]
    pd.DataFrame(rows).to_csv(tmp_path / "modular_ft.csv", index=False)
    code, out, _ = _run(["claims", str(tmp_path), "--format", "csv"], capsys)
    assert code == 0
    got = pd.read_csv(io.StringIO(out))
    assert set(got.claim) == {5} and set(got.task) == {"new primes", "factor reuse", "new minus reuse"}
    assert got.set_index("task").loc["new primes", "verdict"] == "reproduced"
    assert (tmp_path / "claims.csv").exists() and (tmp_path / "fig_claim5_balancedness.png").exists()


@pytest.mark.parametrize("args, needle", [
    (["claims", "/nonexistent/folder"], "neither vision_ft.csv"),
    (["vision", "--out", "/tmp/ftlab-never", "--seeds", "x"], "--seeds"),
    (["modular", "--out", "/tmp/ftlab-never", "--seeds", ","], "--seeds"),
])
def test_bad_input_is_one_line_exit_2(args, needle, capsys):
    code, _, err = _run(args, capsys)
    assert code == 2
    assert err.startswith("ftlab: error:") and needle in err and err.count("\n") == 1
