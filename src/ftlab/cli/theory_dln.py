"""``ftlab theory metrics`` and ``ftlab theory simulate``: the diagonal-network engine on the command line."""

from __future__ import annotations

import itertools

import click

from ftlab.cli.output import emit, format_option

_CTX = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _scales(multiple: bool):
    def deco(f):
        for name, default, text in reversed([
            ("--c", 1e-3, "PT absolute init scale c (> 0)."),
            ("--lam", 0.0, "PT relative scale lambda, normalized to [-1, 1] (authors' code: lambda_u = lam * c)."),
            ("--gamma", 0.0, "FT readout re-initialization scale gamma (>= 0)."),
        ]):
            f = click.option(name, type=float, default=(default,) if multiple else default, multiple=multiple,
                             show_default=True, help=text + (" Repeatable." if multiple else ""))(f)
        return f
    return deco


@click.command(context_settings=_CTX)
@_scales(multiple=True)
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
@_scales(multiple=False)
@click.option("--rho-pt", type=float, default=0.1, show_default=True, help="PT teacher sparsity in [0, 1].")
@click.option("--rho-ft", type=float, default=None, help="FT teacher sparsity in [0, 1]  [default: 0.1].")
@click.option("--overlap", type=float, default=None,
              help="omega = |S_PT ∩ S_FT| / |S_FT|  [default: 1]. Or give --rho-shared and --rho-new.")
@click.option("--rho-shared", type=float, default=None, help="P(FT-active | PT-active); with --rho-new.")
@click.option("--rho-new", type=float, default=None, help="P(FT-active | PT-inactive); with --rho-shared.")
@click.option("--alpha-pt", type=float, default=None,
              help="PT samples per dimension; omitted = exact infinite-PT oracle.")
@click.option("--alpha", type=float, multiple=True, default=(0.3,), show_default=True,
              help="FT samples per dimension (N = round(alpha D)). Repeatable.")
@click.option("--dim", type=int, default=500, show_default=True, help="Dimension D.")
@click.option("--seeds", type=int, default=1, show_default=True, help="Number of seeds (0 .. seeds-1).")
@click.option("--noise", type=float, default=0.0, show_default=True, help="FT label-noise std sigma.")
@click.option("--pt-noise", type=float, default=0.0, show_default=True, help="PT label-noise std (with --alpha-pt).")
@click.option("--pt-magnitude", type=click.Choice(["fixed", "gaussian"]), default="fixed", show_default=True,
              help="PT teacher values: a_pt on the support (authors' code) or N(0, 1/rho_pt) [U].")
@click.option("--method", type=click.Choice(["flow", "gd"]), default="flow", show_default=True,
              help="Exact gradient flow, or the authors' GD (lr 0.5, stop at train MSE < 1e-4).")
@click.option("--beta-pt", type=float, default=1.0, show_default=True, help="|beta_PT| for the l_order/pd columns.")
@click.option("--beta-ft", type=float, default=1.0, show_default=True, help="|beta_FT| for the l_order/pd columns.")
@format_option
def simulate(c, lam, gamma, rho_pt, rho_ft, overlap, rho_shared, rho_new, alpha_pt, alpha, dim, seeds, noise, pt_noise,
             pt_magnitude, method, beta_pt, beta_ft, fmt):
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
    from ftlab.core.progress import progress
    from ftlab.core.validate import check_int, check_memory, check_positive
    from ftlab.dln.bias import check_scales
    from ftlab.dln.regimes import metrics as compute
    from ftlab.dln.simulate import memory_estimate, simulate_ptft
    from ftlab.dln.tasks import TaskSpec

    check_scales(c=c, lam=lam, gamma=gamma)
    dim = check_int("dim", dim, 1)
    seeds = check_int("seeds", seeds, 1)
    for a in alpha:
        check_positive("alpha", a)
    if alpha_pt is not None:
        check_positive("alpha_pt", alpha_pt)
    check_memory(f"simulate --dim {dim} --alpha {max(alpha):g}", memory_estimate(dim=dim, alpha=max(alpha),
                                                                                 alpha_pt=alpha_pt),
                 hint="reduce --dim or --alpha")
    extra = {"noise": noise, "pt_noise": pt_noise, "pt_magnitude": pt_magnitude}
    if rho_shared is not None or rho_new is not None:
        if rho_shared is None or rho_new is None or overlap is not None or rho_ft is not None:
            raise ValueError("rho_shared/rho_new: give both, and neither --overlap nor --rho-ft with them")
        spec = TaskSpec.from_conditional(rho_pt=rho_pt, rho_shared=rho_shared, rho_new=rho_new, **extra)
    else:
        spec = TaskSpec(rho_pt=rho_pt, rho_ft=0.1 if rho_ft is None else rho_ft,
                        overlap=1.0 if overlap is None else overlap, **extra)
    m = compute(beta_pt=beta_pt, beta_ft=beta_ft, c=c, lam=lam, gamma=gamma)
    base = {"c": c, "lam": lam, "gamma": gamma, "rho_pt": spec.rho_pt, "rho_ft": spec.rho_ft, "overlap": spec.overlap,
            "rho_shared": spec.rho_shared, "rho_new": spec.rho_new, "alpha_pt": alpha_pt, "dim": dim, "noise": noise,
            "method": method}
    points = list(itertools.product(alpha, range(seeds)))
    records = []
    for a, s in progress(points, desc="simulate", total=len(points)):
        r = simulate_ptft(spec, c=c, lam=lam, gamma=gamma, alpha_pt=alpha_pt, alpha=a, dim=dim, seed=s, method=method)
        records.append(base | {"alpha": a, "seed": s, "error": r.error, "error_pred": r.error_pred,
                               "distance": r.distance, "pt_error": r.pt_error, "l_order": m.l_order, "pd": m.pd,
                               "regime": m.regime, "converged": r.converged, "n_iter": r.n_iter})
    emit(records, fmt)
