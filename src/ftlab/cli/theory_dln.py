"""``ftlab theory metrics`` and ``ftlab theory simulate``: the diagonal-network engine on the command line."""

from __future__ import annotations

import itertools

import click

from ftlab.cli.output import emit, format_option
from ftlab.cli.theory import (
    alpha_pt_option,
    check_runs,
    repeatable_scale_options,
    scales_options,
    setting_record,
    task_options,
)

_CTX = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.command(context_settings=_CTX)
@repeatable_scale_options
@click.option("--beta-pt", type=float, multiple=True, default=(1.0,), show_default=True,
              help="|beta_PT| of the coordinate (the PT solution there). Repeatable.")
@click.option("--beta-ft", type=float, multiple=True, default=(1.0,), show_default=True,
              help="|beta_FT| at which the local slopes are evaluated. Repeatable.")
@format_option
def metrics(c, lam, gamma, beta_pt, beta_ft, fmt):
    """l-order, pretraining dependence (PD) and regime (I-IV) of a setting.

    \b
    For one coordinate with FT geometry k(|beta_PT|) (the implicit-bias theorem of arXiv 2602.20062):
      l_order = d log q_k(beta_FT) / d log |beta_FT|   in [1, 2]   (1: l1/rich, 2: l2/lazy)
      pd      = d log q_k(beta_FT) / d log |beta_PT|   in [-1, 0]  (-1: fully PT-dependent)
    and the regime: I rich/PT-independent, II lazy/PT-dependent, III lazy/PT-independent,
    IV rich/PT-dependent (thresholds l < 1.5 = rich, PD < -0.1 = dependent: ftlab's convention).
    Repeating an option evaluates every combination.

    \b
    Examples:
      ftlab theory metrics --c 1e-3 --lam -0.99
      ftlab theory metrics --lam -0.99 --lam 0 --lam 0.99 --gamma 0 --gamma 10 --format csv
    """
    from ftlab.dln.regimes import metrics as compute

    records = []
    for c_, lam_, g_, bp, bf in itertools.product(c, lam, gamma, beta_pt, beta_ft):
        m = compute(beta_pt=bp, beta_ft=bf, c=c_, lam=lam_, gamma=g_)
        records.append({"c": c_, "lam": lam_, "gamma": g_, "beta_pt": bp, "beta_ft": bf, "l_order": m.l_order,
                        "m": m.m, "pd": m.pd, "l_plus_pd": m.l_plus_pd, "k": m.k, "regime": m.regime})
    emit(records, fmt)


@click.command(context_settings=_CTX)
@scales_options
@task_options
@alpha_pt_option
@click.option("--alpha", type=float, multiple=True, default=(0.3,), show_default=True,
              help="FT samples per dimension (N = round(alpha D)). Repeatable.")
@click.option("--dim", type=int, default=500, show_default=True, help="Dimension D (>= 2).")
@click.option("--seeds", type=int, default=1, show_default=True, help="Number of seeds (0 .. seeds-1).")
@click.option("--method", type=click.Choice(["flow", "gd"]), default="flow", show_default=True,
              help="Exact gradient flow, or the authors' GD (lr 0.5, stop at train MSE < 1e-4).")
@click.option("--beta-pt", type=float, default=1.0, show_default=True, help="|beta_PT| for the l_order/pd columns.")
@click.option("--beta-ft", type=float, default=1.0, show_default=True, help="|beta_FT| for the l_order/pd columns.")
@format_option
def simulate(scales, spec, alpha_pt, alpha, dim, seeds, method, beta_pt, beta_ft, fmt):
    """Simulate pretraining + fine-tuning of the diagonal network; compare with the implicit bias.

    \b
    For each FT sample ratio alpha and seed: sample the teachers and data, pretrain
    (oracle by default), reset the readout to gamma, fine-tune to interpolation, and report
      error       (1/D) ||beta_hat - beta*_FT||^2   (FT generalization error)
      error_pred  the same for argmin Q_k s.t. X beta = y (the implicit-bias prediction)
      distance    ||beta_hat - beta_pred|| / ||beta_pred||
    plus l_order, pd and regime of the setting at (--beta-pt, --beta-ft) and converged.

    \b
    Examples:
      ftlab theory simulate --c 1e-3 --lam -0.99 --alpha 0.1 --alpha 0.3 --seeds 3
      ftlab theory simulate --rho-shared 0.5 --rho-new 0.05 --alpha-pt 0.2 --format json
      ftlab theory simulate --method gd --dim 1000 --alpha 0.2
    """
    from dataclasses import asdict

    from ftlab.core.progress import progress
    from ftlab.core.validate import check_int, check_memory, check_positive
    from ftlab.dln.regimes import metrics as compute
    from ftlab.dln.simulate import MIN_DIM, memory_estimate, simulate_ptft

    dim = check_int("dim", dim, MIN_DIM)
    seeds = check_int("seeds", seeds, 1)
    for a in alpha:
        check_positive("alpha", a)
    if alpha_pt is not None:
        check_positive("alpha_pt", alpha_pt)
    check_runs(seeds, len(alpha))
    check_memory(f"simulate --dim {dim} --alpha {max(alpha):g}", memory_estimate(dim=dim, alpha=max(alpha),
                                                                                 alpha_pt=alpha_pt),
                 hint="reduce --dim or --alpha")
    m = compute(beta_pt=beta_pt, beta_ft=beta_ft, **asdict(scales))
    base = setting_record(spec, scales, alpha_pt) | {"dim": dim, "noise": spec.noise, "method": method}
    points = list(itertools.product(alpha, range(seeds)))
    records = []
    for a, s in progress(points, desc="simulate", total=len(points)):
        r = simulate_ptft(spec, scales, alpha_pt=alpha_pt, alpha=a, dim=dim, seed=s, method=method)
        records.append(base | {"alpha": a, "seed": s, "error": r.error, "error_pred": r.error_pred,
                               "distance": r.distance, "pt_error": r.pt_error, "l_order": m.l_order, "pd": m.pd,
                               "regime": m.regime, "converged": r.converged, "n_iter": r.n_iter})
    emit(records, fmt)
