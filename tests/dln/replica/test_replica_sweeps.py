"""Replica vs simulation, sweeps through the local pool / Dask / a resumed store, the CLI contract, the advisor."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from ftlab.core.sweep import read_store
from ftlab.dln.advisor import advise, phase_diagram, predicted_error
from ftlab.dln.model import InitScales
from ftlab.dln.replica.curves import ExpectationOptions, learning_curve, setting_point, simulate_curve, split_point
from ftlab.dln.tasks import TaskSpec

SETTINGS = [  # (overlap, rho_ft, lam, gamma): regimes II, IV on full overlap, IV on new features, I on a sparse subset
    (1.0, 0.1, 0.0, 0.0),
    (1.0, 0.1, -0.99, 0.0),
    (0.0, 0.1, -0.99, 0.0),
    (1.0, 0.01, -0.999999, 1e-6),
]


def _agreement(settings, alphas, dim, seeds, method="implicit"):
    inside = total = 0
    for overlap, rho_ft, lam, gamma in settings:
        spec, scales = TaskSpec(rho_pt=0.1, rho_ft=rho_ft, overlap=overlap), InitScales(c=1e-3, lam=lam, gamma=gamma)
        theory = learning_curve(spec, scales, alphas).error.to_numpy()
        agg, raw = simulate_curve(spec, scales, alphas, dim=dim, seeds=seeds, workers=1, method=method)
        assert raw.sim_converged.all()
        ok = np.abs(agg.sim_error_mean.to_numpy() - theory) <= agg.sim_error_ci.to_numpy() + 2e-3
        inside += int(ok.sum())
        total += len(ok)
    return inside / total


def test_theory_matches_exact_interpolator_simulations_quick():
    """Quick CI version: D = 400, 4 seeds; the simulated endpoint is the exact FT interpolator
    argmin Q_k s.t. X beta = y (what gradient flow converges to), not gradient descent itself."""
    assert _agreement(SETTINGS, [0.1, 0.2, 0.3], dim=400, seeds=range(4)) >= 0.8


@pytest.mark.slow
def test_theory_matches_simulation_regime_comparison_large_d():
    """The regime comparison (3 tasks x 4 regimes x 5 alphas) at D = 1000 with 5 seeds."""
    regimes = [(0.0, 0.0), (-0.99, 0.0), (-0.999999, 1e-6), (0.0, 10.0)]
    tasks = [(0.0, 0.1), (1.0, 0.1), (1.0, 0.01)]
    settings = [(o, r, lam, g) for o, r in tasks for lam, g in regimes]
    assert _agreement(settings, [0.05, 0.1, 0.2, 0.3, 0.5], dim=1000, seeds=range(5)) >= 0.85


@pytest.mark.slow
def test_gradient_flow_of_the_network_reaches_the_simulated_endpoint():
    """The quick/large simulations use the exact interpolator; the network's own gradient flow
    (ftlab.dln.simulate, D = 1000) must land on the same test error, seed by seed."""
    for overlap, rho_ft, lam, gamma in SETTINGS[:2]:
        args = (TaskSpec(rho_pt=0.1, rho_ft=rho_ft, overlap=overlap), InitScales(c=1e-3, lam=lam, gamma=gamma),
                [0.1, 0.3])
        _, flow = simulate_curve(*args, dim=1000, seeds=range(3), workers=1, method="flow")
        _, exact = simulate_curve(*args, dim=1000, seeds=range(3), workers=1, method="implicit")
        assert flow.sim_converged.all()
        assert np.allclose(flow.sim_error, exact.sim_error, rtol=1e-4, atol=1e-8)


def test_dask_local_cluster_gives_the_same_sweep_as_the_local_runner():
    distributed = pytest.importorskip("dask.distributed")
    args = (TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=1.0), InitScales(c=1e-3, lam=-0.99, gamma=0.0), [0.1, 0.25])
    local, raw_local = simulate_curve(*args, dim=200, seeds=range(2), workers=1)
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None) as cl:
        with distributed.Client(cl) as client:
            remote, raw_remote = simulate_curve(*args, dim=200, seeds=range(2), scheduler=client)
    assert np.allclose(local.sim_error_mean, remote.sim_error_mean, rtol=1e-12)
    assert np.allclose(np.sort(raw_local.sim_error), np.sort(raw_remote.sim_error), rtol=1e-12)


def test_resumed_sweep_recomputes_nothing_finished(tmp_path):
    store = tmp_path / "sim.jsonl"
    args = (TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=0.5), InitScales(c=1e-3, lam=0.0, gamma=0.0), [0.1, 0.3])
    kw = dict(dim=150, workers=1, store=store)
    first, _ = simulate_curve(*args, **kw, seeds=range(2))
    assert len(read_store(store)) == 4
    lines_before = store.read_text().splitlines()
    # a "killed" run left a truncated line: it is ignored and that point recomputed
    with open(store, "a") as fh:
        fh.write('{"key": "trunc')
    second, _ = simulate_curve(*args, **kw, seeds=range(3))
    lines_after = [ln for ln in store.read_text().splitlines() if ln.strip()]
    assert lines_after[: len(lines_before)] == lines_before  # finished points untouched
    assert len(read_store(store)) == 6  # only the 2 new points were appended
    assert second.n_seeds.tolist() == [3, 3]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "ftlab.cli.main", *args], capture_output=True, text=True)


def test_cli_curve_json_records_and_files(tmp_path):
    out = tmp_path / "run"
    r = _cli("theory", "curve", "--gamma", "10", "--alpha", "0.2", "--alpha", "0.4", "--seeds", "2", "--dim", "200",
             "--out", str(out), "--format", "json")
    assert r.returncode == 0, r.stderr
    recs = json.loads(r.stdout)
    assert [x["alpha"] for x in recs] == [0.2, 0.4]
    for x in recs:
        assert x["converged"] is True and x["gamma"] == 10.0
        assert abs(x["error"] - (1 - x["alpha"])) < 0.01  # regime III ~ min-l2
        assert abs(x["sim_error_mean"] - x["error"]) < x["sim_error_ci"] + 0.02
    assert (out / "curve.csv").exists() and (out / "curve.csv.meta.json").exists() and (out / "curve.png").exists()


@pytest.mark.parametrize("args,needle", [
    (["--alpha", "0"], "alpha"),
    (["--alphas", "0.1:0.5"], "alphas"),
    (["--overlap", "1", "--rho-pt", "0.05"], "overlap"),
    (["--lam", "-1"], "lam"),
    (["--rho-shared", "0.5"], "rho_shared"),
])
def test_cli_curve_bad_input_is_one_line_exit_2(args, needle):
    r = _cli("theory", "curve", *args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ftlab: error:") and needle in lines[0]


def test_advisor_prefers_the_regime_the_theory_says_and_beats_every_corner():
    # sparse subset of PT features: rich regimes (I/IV) beat lazy ones by orders of magnitude
    adv = advise(TaskSpec(rho_pt=0.1, rho_ft=0.01, overlap=1.0), alpha=0.1, refine=False)
    assert adv.error <= min(adv.corners.values()) + 1e-12
    assert adv.corners["II"] > 10 * min(adv.corners["I"], adv.corners["IV"])
    assert adv.regime in ("I", "IV")
    # the advice is a real minimum: the reported setting reproduces its error
    again = learning_curve(TaskSpec(rho_pt=0.1, rho_ft=0.01, overlap=1.0), adv.scales, [0.1],
                           expectation=ExpectationOptions(n_nodes=400)).error.iloc[0]
    assert again == pytest.approx(adv.error, rel=1e-6, abs=1e-12)


def test_phase_diagram_marks_infeasible_cells_and_full_overlap_prefers_pt_dependence():
    df = phase_diagram(TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=1.0), alpha=0.2, overlaps=[0.0, 1.0],
                       ratios=[1.0, 20.0], workers=1)
    infeasible = df[(df.overlap == 1.0) & (df.ratio == 20.0)]
    assert infeasible.best.isna().all() and np.isnan(infeasible.error_II).all()
    same = df[(df.overlap == 1.0) & (df.ratio == 1.0)].iloc[0]
    new = df[(df.overlap == 0.0) & (df.ratio == 1.0)].iloc[0]
    assert same.best == "II"  # at alpha = 0.2 II wins when FT reuses all PT features (docs/dln.md)
    assert new.best in ("I", "IV") and new.error_I < new.error_II


def test_phase_diagram_keeps_the_base_task_statistics():
    """A cell of the phase diagram equals the advisor's prediction for the same task: the base task's other
    statistics (here Gaussian PT magnitudes and label noise) travel with it."""
    base = TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=1.0, pt_magnitude="gaussian", noise=0.1)
    df = phase_diagram(base, alpha=0.2, overlaps=[0.5], ratios=[0.5], workers=1)
    assert df.pt_magnitude.tolist() == ["gaussian"] and df.noise.tolist() == [0.1]
    cell = TaskSpec(rho_pt=0.1, rho_ft=0.05, overlap=0.5, pt_magnitude="gaussian", noise=0.1)
    plain = TaskSpec(rho_pt=0.1, rho_ft=0.05, overlap=0.5)
    for name, (lam, gamma) in (("II", (0.0, 0.0)), ("IV", (-0.99, 0.0))):
        scales = InitScales(c=1e-3, lam=lam, gamma=gamma)
        assert df[f"error_{name}"].iloc[0] == predicted_error(cell, scales, alpha=0.2).error
        assert df[f"error_{name}"].iloc[0] != predicted_error(plain, scales, alpha=0.2).error


@pytest.mark.parametrize("spec", [TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=1.0),
                                  TaskSpec(rho_pt=0.2, rho_ft=0.05, overlap=0.3, pt_magnitude="gaussian", a_pt=2.0,
                                           noise=0.1, pt_noise=0.2, support="bernoulli")])
def test_a_setting_survives_its_flat_sweep_point(spec):
    scales = InitScales(c=0.01, lam=-0.5, gamma=0.3)
    point = setting_point(spec, scales)
    assert list(point)[:3] == ["rho_pt", "rho_ft", "overlap"] and list(point)[-3:] == ["c", "lam", "gamma"]
    assert (len(point) == 6) == (spec == TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=1.0))  # defaults are left out
    back, scales_back, rest = split_point(point | {"alpha": 0.2})
    assert back == spec and scales_back == scales and rest == {"alpha": 0.2}


def test_report_lorder_part_checks_the_trade_off(tmp_path):
    """The report's l-order/PD maps: every cell obeys l in [1,2], PD in [-1,0], and none reaches (1, -1)."""
    from ftlab.report import ReportContext
    from ftlab.report.replica import run

    md = run(ReportContext(out_dir=tmp_path, figures=("lorder",), workers=1))
    assert "![](replica/lorder.png)" in md and (tmp_path / "replica" / "lorder.png").exists()
    assert "| fails |" not in md and md.count("| holds |") == 2
    assert "### Fig. 3" not in md  # only the requested figure
