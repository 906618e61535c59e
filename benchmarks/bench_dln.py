"""Benchmark: exact implicit-bias solve and exact gradient flow vs the authors' gradient descent.

Setting: D = 5000, alpha_FT = 0.5, rho_PT = rho_FT = 0.1 (overlap 0.5, PT oracle with
a_PT = 1), c = 1e-3, gamma = 0, for lam = 0 (Regime II) and lam = -0.99 (Regime IV).
Side by side in one run and one process, one BLAS thread each:

* ``solve``: :func:`ftlab.dln.solve_implicit_bias` to relative residual 1e-12 (the reference);
* ``gd``: :func:`ftlab.dln.gradient_descent`, lr 0.5, until training MSE < 1e-4 (authors' protocol);
* ``flow``: :func:`ftlab.dln.gradient_flow` stopped by the *same* rule (training MSE < 1e-4), with
  BDF tolerances rtol 1e-2 / atol 1e-5 (the path is traced to ~1e-2; GD's own path error is O(lr));
  the endpoint distances of flow and GD to the exact solution are reported side by side.

Run: ``.venv/bin/python benchmarks/bench_dln.py`` (several minutes: GD needs tens of thousands of
full-batch steps), or ``--dim 1000`` for a quick look. Results go to docs/benchmarks.md (section ``dln``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import ftlab.dln as dln  # noqa: E402
from _common import write_section  # noqa: E402


def _timed(fn):
    """(result, CPU seconds of this process, wall seconds): CPU time is robust to other jobs' load."""
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.process_time() - c0, time.perf_counter() - w0


def run_setting(dim: int, lam: float, *, alpha=0.5, c=1e-3, gamma=0.0, seed=0) -> dict:
    spec = dln.TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=0.5)
    p = dln.sample_problem(spec, alpha=alpha, dim=dim, seed=seed)
    w = dln.ft_reset(dln.oracle_pt(p.beta_pt_star, c=c, lam=lam), gamma=gamma)
    X, y, star = p.X_ft, p.y_ft, p.beta_ft_star
    solve, t_solve, w_solve = _timed(lambda: dln.solve_implicit_bias(X, y, w.k))
    ref = solve.beta
    flow, t_flow, w_flow = _timed(lambda: dln.gradient_flow(w, X, y, tol=1e-4, rtol=1e-2, atol=1e-5))
    gd, t_gd, w_gd = _timed(lambda: dln.gradient_descent(w, X, y, lr=0.5, tol=1e-4))

    def rel(b):
        return float(np.linalg.norm(b - ref) / np.linalg.norm(ref))

    def err(b):
        return float(np.sum((b - star) ** 2) / dim)

    return {
        "dim": dim, "lam": lam, "n": X.shape[0],
        "t_solve": t_solve, "solve_iter": solve.n_iter, "solve_res": solve.residual, "err_solve": err(ref),
        "t_flow": t_flow, "flow_steps": flow.n_iter, "dist_flow": rel(flow.beta), "err_flow": err(flow.beta),
        "t_gd": t_gd, "gd_steps": gd.n_iter, "dist_gd": rel(gd.beta), "err_gd": err(gd.beta),
        "wall_solve": w_solve, "wall_flow": w_flow, "wall_gd": w_gd,
        "gd_converged": gd.converged, "gd_drift": gd.invariant_drift, "flow_drift": flow.invariant_drift,
    }


def render(rows: list[dict]) -> str:
    """Markdown for docs/benchmarks.md from the rows of :func:`run_setting`."""
    lines = [
        "### Diagonal network: exact solve and exact flow vs the authors' GD",
        "",
        f"D = {rows[0]['dim']}, alpha_FT = 0.5 (N = {rows[0]['n']}), rho_PT = rho_FT = 0.1, overlap 0.5, PT oracle "
        "(a_PT = 1), c = 1e-3, gamma = 0, seed 0; one BLAS thread; the three methods timed one after the other in "
        "the same process, in CPU seconds of that process (wall seconds, which depend on other jobs' load, in "
        "brackets). *dist* = ||beta - beta_solve|| / ||beta_solve||, *error* = (1/D)||beta - beta*_FT||^2. "
        "GD: lr 0.5, stop at training MSE < 1e-4 (authors' protocol); flow: the same stopping rule (BDF, rtol 1e-2). "
        "Goals: solve >= 100x faster than GD; flow >= 10x faster than GD at equal endpoint accuracy.",
        "",
        "| lam (regime) | solve: CPU s [wall] (Newton steps) | flow: CPU s [wall] (steps) | GD: CPU s [wall] (steps) "
        "| GD / solve | GD / flow "
        "| dist flow | dist GD | error solve / flow / GD |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        reg = "II" if r["lam"] == 0.0 else "IV"
        lines.append(
            f"| {r['lam']:g} ({reg}) | {r['t_solve']:.2f} [{r['wall_solve']:.2f}] ({r['solve_iter']}) "
            f"| {r['t_flow']:.1f} [{r['wall_flow']:.1f}] ({r['flow_steps']}) "
            f"| {r['t_gd']:.1f} [{r['wall_gd']:.1f}] ({r['gd_steps']}) | **{r['t_gd'] / r['t_solve']:.0f}x** "
            f"| **{r['t_gd'] / r['t_flow']:.0f}x** "
            f"| {r['dist_flow']:.2e} | {r['dist_gd']:.2e} | {r['err_solve']:.5f} / {r['err_flow']:.5f} / {r['err_gd']:.5f} |"
        )
    lines += [
        "",
        "GD's invariant drift (max relative change of w^2 - v^2 and w+ w- + v+ v-): "
        + ", ".join(f"lam={r['lam']:g}: {r['gd_drift']:.1e}" for r in rows)
        + "; the flow's: " + ", ".join(f"{r['flow_drift']:.1e}" for r in rows) + " (rounding).",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=5000)
    ap.add_argument("--lam", type=float, nargs="+", default=[0.0, -0.99])
    ap.add_argument("--no-write", action="store_true", help="print only; do not touch docs/benchmarks.md")
    args = ap.parse_args()
    rows = []
    for lam in args.lam:
        rows.append(run_setting(args.dim, lam))
        print(rows[-1], flush=True)
        if not args.no_write:  # after every setting, so that a long run leaves its finished part
            write_section("dln", render(rows))
    print(render(rows))


if __name__ == "__main__":
    main()
