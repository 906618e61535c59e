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


def test_claims_command_recomputes_verdicts_and_figures_from_a_planted_table(tmp_path, capsys):
    """The command that recomputes a recorded run's verdicts without training, on a tiny planted table of the
    compact per-seed format: b < 0 helps on every modulus (primary 5 reproduced at 12 seeds), b > 0 does nothing."""
    rows = [dict(seed=s, p=p, kind=k, when="post", b=b, ft_loss=0.005, ft_converged=True,
                 acc=0.5 + (0.05 if b < 0 else 0) + 0.01 * s + 0.004 * ((s * 5 + p) % 3) * (b != 0))
            for s in range(12) for p, k in ((3, "reuse"), (7, "new")) for b in (-0.5, 0.0, 0.5)]
    tables = tmp_path / "tables"
    tables.mkdir()
    pd.DataFrame(rows).to_csv(tables / "modular_ft.csv", index=False)
    code, out, _ = _run(["claims", str(tables), "--out", str(tmp_path / "re"), "--level", "primary", "--format", "csv"],
                        capsys)
    assert code == 0
    got = pd.read_csv(io.StringIO(out))
    assert list(got.claim) == [5] and got.verdict.iloc[0] == "reproduced" and got.seeds.iloc[0] == 12
    assert got.effect.iloc[0] == pytest.approx(0.05 + 0.004 * 1, abs=0.004)
    assert (tmp_path / "re" / "claims.csv").exists() and (tmp_path / "re" / "fig_claim5_balancedness.png").exists()
    assert not (tables / "claims.csv").exists()  # the recorded tables are only read
    full = pd.read_csv(tmp_path / "re" / "claims.csv")
    assert list(dict.fromkeys(full.level)) == ["primary", "secondary", "ftlab"]


@pytest.mark.parametrize("args, needle", [
    (["claims", "/nonexistent/folder"], "neither vision_ft.csv"),
    (["vision", "--out", "/tmp/ftlab-never", "--seeds", "x"], "--seeds"),
    (["modular", "--out", "/tmp/ftlab-never", "--seeds", ","], "--seeds"),
])
def test_bad_input_is_one_line_exit_2(args, needle, capsys):
    code, _, err = _run(args, capsys)
    assert code == 2
    assert err.startswith("ftlab: error:") and needle in err and err.count("\n") == 1


def test_geometry_refuses_arrays_that_share_neither_samples_nor_features(tmp_path, capsys):
    rng = np.random.default_rng(1)
    np.save(tmp_path / "x.npy", rng.standard_normal((30, 5)))
    np.save(tmp_path / "y.npy", rng.standard_normal((20, 7)))
    code, out, err = _run(["geometry", str(tmp_path / "x.npy"), str(tmp_path / "y.npy")], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "30 x 5" in err and "20 x 7" in err


def test_geometry_same_features_other_samples_gives_ensd_without_cka(tmp_path, capsys):
    rng = np.random.default_rng(2)
    X, Y = rng.standard_normal((30, 5)), rng.standard_normal((20, 5))
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", Y)
    code, out, _ = _run(["geometry", str(tmp_path / "x.npy"), str(tmp_path / "y.npy"), "--format", "json"], capsys)
    rec = json.loads(out)[0]
    assert code == 0 and "cka" not in rec and rec["ensd"] == pytest.approx(ensd(X, Y))


@pytest.mark.parametrize("array, needle", [
    (np.zeros((0, 4)), "shape (0, 4)"),
    (np.ones(5), "shape (5,)"),
    (np.array([[1.0, np.nan], [0.0, 1.0]]), "non-finite"),
    (np.array([["a", "b"], ["c", "d"]]), "not numbers"),
])
def test_geometry_refuses_unusable_arrays_in_one_line(array, needle, tmp_path, capsys):
    np.save(tmp_path / "x.npy", array)
    code, _, err = _run(["geometry", str(tmp_path / "x.npy")], capsys)
    assert code == 2 and needle in err and err.count("\n") == 1


def test_geometry_refuses_a_pickled_array_without_unpickling(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.array([{"a": 1}, {"b": 2}], dtype=object), allow_pickle=True)
    code, _, err = _run(["geometry", str(tmp_path / "x.npy")], capsys)
    assert code == 2 and "without pickle" in err and err.count("\n") == 1
