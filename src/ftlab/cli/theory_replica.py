"""``ftlab theory curve`` and ``ftlab theory advise``: replica learning curves and the initialization advisor."""

from __future__ import annotations

from pathlib import Path

import click

from ftlab.cli.output import emit, format_option
from ftlab.cli.theory import alpha_pt_option, check_runs, scales_options, setting_record, task_options

_CTX = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


#: Above this many alpha points a run needs --yes.
MAX_POINTS = 10_000
#: Above this many phase-diagram cells (each a replica solve at four corners) a run needs --yes.
MAX_CELLS = 2_500


def parse_alphas(values: tuple[str, ...], grid: str | None, *, allow_long: bool = False):
    """``--alpha`` values plus an optional ``--alphas START:STOP:N`` grid (linspace, inclusive).

    More than :data:`MAX_POINTS` points are refused (before any work) unless ``allow_long``.
    """
    import numpy as np

    from ftlab.core.validate import check_work

    out = [float(v) for v in values]
    if grid:
        parts = grid.split(":")
        try:
            start, stop, n = float(parts[0]), float(parts[1]), int(parts[2])
            if len(parts) != 3:
                raise ValueError
        except (ValueError, IndexError):
            raise ValueError(f"alphas={grid!r} is not a grid spec: use START:STOP:N, e.g. 0.01:0.5:80") from None
        if n < 1:
            raise ValueError(f"alphas={grid!r}: N must be >= 1")
        check_work(f"--alphas {grid}: the number of alpha points", n, MAX_POINTS, allow=allow_long)
        out += [float(a) for a in np.linspace(start, stop, n)]
    if not out:
        out = [float(a) for a in np.linspace(0.01, 0.5, 50)]
    return sorted(set(out))


@click.command(context_settings=_CTX)
@scales_options
@task_options
@alpha_pt_option
@click.option("--alpha", "alpha", multiple=True, help="FT samples per dimension. Repeatable.")
@click.option("--alphas", "alpha_grid", default=None, help="Grid START:STOP:N (inclusive linspace), e.g. 0.01:0.5:80.")
@click.option("--seeds", type=int, default=0, show_default=True,
              help="Simulated seeds per alpha (0 = theory only).")
@click.option("--dim", type=int, default=1000, show_default=True, help="Dimension D of the simulations (>= 2).")
@click.option("--sim-method", type=click.Choice(["implicit", "flow", "gd"]), default="implicit", show_default=True,
              help="Simulation: exact FT interpolator argmin Q_k (implicit), gradient flow, or the authors' GD.")
@click.option("--expectation", type=click.Choice(["quadrature", "mc"]), default="quadrature", show_default=True,
              help="Replica expectations: deterministic quadrature, or the authors' Monte Carlo (80k samples).")
@click.option("--lambda-reg", type=float, default=0.0, show_default=True,
              help="Explicit regularization of the replica problem (0 = the interpolator GF reaches).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for curve.csv (+ .meta.json sidecar) and curve.png, written all-or-nothing; the "
                   "simulation store there makes an interrupted run resumable.")
@click.option("--scheduler", default=None, help="Dask scheduler address for the simulation sweep.")
@click.option("--workers", type=int, default=None, help="Local worker processes for the simulation sweep (>= 1).")
@click.option("--yes", "allow_long", is_flag=True, help=f"Allow more than {MAX_POINTS:,} alpha points.")
@format_option
def curve(scales, spec, alpha_pt, alpha, alpha_grid, seeds, dim, sim_method, expectation, lambda_reg, out, scheduler,
          workers, allow_long, fmt):
    """Replica learning curve E_g(alpha) of fine-tuning, optionally against simulations.

    \b
    E_g = (1/D) E||beta_hat - beta*_FT||^2 in the limit D -> inf at fixed alpha = N_FT/D, for the
    interpolator that FT gradient flow reaches (argmin Q_k s.t. X beta = y, k from c, lam, gamma and
    |beta_PT|). One record per alpha: inputs, error, converged (False = flagged, never hidden),
    theta0/theta (order parameters), residual, branch (unique / forward / backward when two
    continuation branches exist); with --seeds also sim_error_mean and sim_error_ci (95% t-interval).

    \b
    Examples:
      ftlab theory curve --lam -0.99 --overlap 1 --rho-ft 0.01 --alphas 0.01:0.5:40
      ftlab theory curve --gamma 10 --alpha 0.1 --alpha 0.3 --format json
      ftlab theory curve --lam -0.99 --alphas 0.05:0.4:8 --seeds 5 --dim 1000 --out runs/iv
      ftlab theory curve --alpha-pt 0.2 --lam -0.9 --alphas 0.02:0.3:15
    """
    import contextlib

    import numpy as np

    from ftlab.core.results import output_lock
    from ftlab.core.validate import check_int, check_memory, check_workers
    from ftlab.dln.replica.curves import ExpectationOptions, learning_curve
    from ftlab.dln.simulate import MIN_DIM, memory_estimate

    check_workers(workers)
    alphas = parse_alphas(alpha, alpha_grid, allow_long=allow_long)
    check_int("seeds", seeds, 0)
    check_int("dim", dim, MIN_DIM)
    if seeds > 0:
        check_runs(seeds, len(alphas))
        check_memory(f"simulations at --dim {dim}, alpha {max(alphas):g}",
                     memory_estimate(dim=dim, alpha=max(alphas), alpha_pt=alpha_pt), hint="reduce --dim")
    with output_lock(out) if out is not None else contextlib.nullcontext():
        df = learning_curve(spec, scales, alphas, alpha_pt=alpha_pt, lambda_reg=lambda_reg,
                            expectation=ExpectationOptions(kind=expectation))
        if seeds > 0:
            store = out / "simulations.jsonl" if out is not None else None  # written in place: resumable
            agg = _simulations(spec, scales, alphas, alpha_pt, dim=dim, seeds=seeds, method=sim_method, store=store,
                               scheduler=scheduler, workers=workers)
            df = df.merge(agg[["alpha", "sim_error_mean", "sim_error_ci", "n_seeds"]], on="alpha", how="left")
        inputs = setting_record(spec, scales, alpha_pt) | {"noise": spec.noise, "pt_noise": spec.pt_noise,
                                                           "pt_magnitude": spec.pt_magnitude}
        for k_, v in reversed(list(inputs.items())):
            df.insert(0, k_, v)
        if out is not None:
            params = inputs | {"expectation": expectation, "dim": dim, "seeds": seeds, "sim_method": sim_method}
            _write_curve(df, out, params=params, title=f"c={scales.c:g}, lam={scales.lam:g}, gamma={scales.gamma:g}")
    if not bool(np.all(df["converged"])):
        click.echo(f"ftlab: warning: {int((~df['converged']).sum())} alpha point(s) did not converge "
                   "(converged=False in the output)", err=True)
    emit(df.to_dict("records"), fmt)


def _simulations(spec, scales, alphas, alpha_pt, *, dim, seeds, method, **run):
    """Per-alpha simulated errors over seeds 0 .. seeds-1 (:func:`ftlab.dln.replica.curves.simulate_curve`)."""
    from ftlab.dln.replica.curves import simulate_curve

    agg, _ = simulate_curve(spec, scales, alphas, dim=dim, seeds=range(seeds), alpha_pt=alpha_pt, method=method, **run)
    return agg


def _write_curve(df, out: Path, *, params: dict, title: str) -> None:
    """curve.csv (+ sidecar) and curve.png in ``out``, both or neither."""
    from ftlab.core.results import save_table, staged_output

    with staged_output(out, name="curve") as stage:
        save_table(df, stage / "curve.csv", params=params)
        _plot_curve(df, stage / "curve.png", title=title)


def _plot_curve(df, path: Path, *, title: str) -> None:
    from ftlab.core.plotting import new_figure, save_figure

    fig, ax = new_figure()
    ax.plot(df["alpha"], df["error"], "-", label="replica theory")
    bad = ~df["converged"].astype(bool)
    if bad.any():
        ax.plot(df["alpha"][bad], df["error"][bad], "rx", label="not converged")
    if "sim_error_mean" in df:
        ax.errorbar(df["alpha"], df["sim_error_mean"], yerr=df["sim_error_ci"], fmt="o", ms=3, capsize=2,
                    label="simulation (mean, 95% CI)")
    ax.set_xlabel(r"$\alpha = N_{FT}/D$")
    ax.set_ylabel(r"$E_g$")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    save_figure(fig, path)


@click.command(context_settings=_CTX)
@task_options
@alpha_pt_option
@click.option("--alpha", type=float, required=True, help="FT samples per dimension alpha_FT (> 0).")
@click.option("--no-refine", is_flag=True, help="Grid search only (no Nelder-Mead polish).")
@click.option("--phase-out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also draw the best regime over (omega, rho_FT/rho_PT) at this alpha to this PNG (+ CSV).")
@click.option("--phase-size", type=int, default=12, show_default=True, help="Phase-diagram grid size per axis (>= 2).")
@click.option("--scheduler", default=None, help="Dask scheduler address for the phase-diagram sweep.")
@click.option("--workers", type=int, default=None, help="Local worker processes for the phase-diagram sweep (>= 1).")
@click.option("--yes", "allow_long", is_flag=True, help=f"Allow more than {MAX_CELLS:,} phase-diagram cells.")
@format_option
def advise(spec, alpha_pt, alpha, no_refine, phase_out, phase_size, scheduler, workers, allow_long, fmt):
    """Best initialization (c, lambda, gamma) for given task statistics, by replica theory.

    \b
    Scans c in [1e-6, 1], lambda in (-1, 0.99], gamma in [0, 10], polishes the best point, and
    prints it with its regime (I-IV) and predicted FT error, next to the error of each regime's
    corner (c = 1e-3; I: lam -1, gamma 1e-3; II: lam 0, gamma 0; III: gamma 10; IV: lam -0.99).
    The best (c, lambda, gamma) are printed in full precision, so they can be pasted back.
    Beyond the paper: a search over the theory's predictions, not a claim of the paper.
    With --phase-out, the phase diagram keeps the task's other statistics (rho_PT, noise, PT magnitudes).

    \b
    Examples:
      ftlab theory advise --rho-ft 0.01 --overlap 1 --alpha 0.1
      ftlab theory advise --rho-shared 0.2 --rho-new 0.05 --alpha 0.2 --format json
      ftlab theory advise --overlap 0 --alpha 0.15 --phase-out runs/phase.png
    """
    from ftlab.core.validate import check_int, check_positive, check_suffix, check_work, check_workers
    from ftlab.dln.advisor import CORNERS
    from ftlab.dln.advisor import advise as run_advise

    check_positive("alpha", alpha)
    check_workers(workers)
    n = check_int("phase_size", phase_size, 2)
    if phase_out is not None:
        check_suffix("phase_out", phase_out, (".png",))
        check_work(f"--phase-size {n}: the number of phase-diagram cells", n * n, MAX_CELLS, allow=allow_long)
    adv = run_advise(spec, alpha=alpha, alpha_pt=alpha_pt, refine=not no_refine)
    rec = {"rho_pt": spec.rho_pt, "rho_ft": spec.rho_ft, "overlap": spec.overlap, "alpha": alpha, "alpha_pt": alpha_pt,
           "best_c": adv.scales.c, "best_lam": adv.scales.lam, "best_gamma": adv.scales.gamma,
           "best_regime": adv.regime, "best_error": adv.error}
    rec |= {f"corner_{name}_error": adv.corners[name] for name in CORNERS}
    emit([rec], fmt, exact=("best_c", "best_lam", "best_gamma"))
    if phase_out is not None:
        _phase(spec, alpha, alpha_pt, n, Path(phase_out), scheduler=scheduler, workers=workers)


def _phase(spec, alpha, alpha_pt, n: int, target: Path, **run) -> None:
    """The n x n best-regime phase diagram at ``alpha``: ``target`` (PNG) and its CSV, both or neither (one output
    set per target name in its folder, which is locked while the diagram is computed)."""
    import re

    import numpy as np

    from ftlab.core.results import output_lock, save_table, staged_output
    from ftlab.dln.advisor import phase_diagram

    with output_lock(target.parent):
        df = phase_diagram(spec, alpha=alpha, overlaps=np.linspace(0.0, 1.0, n), ratios=np.geomspace(0.05, 5.0, n),
                           alpha_pt=alpha_pt, **run)
        with staged_output(target.parent, name="phase-" + re.sub(r"[^A-Za-z0-9_.-]", "_", target.stem)[:90]) as stage:
            save_table(df, stage / target.with_suffix(".csv").name, params={"rho_pt": spec.rho_pt, "alpha": alpha})
            plot_phase(df, stage / target.name, title=f"best regime, rho_PT={spec.rho_pt:g}, alpha_FT={alpha:g}")


def plot_phase(df, path: Path, *, title: str) -> None:
    """Heatmap of the best regime corner over (omega, rho_FT/rho_PT); infeasible cells blank."""
    import numpy as np
    from matplotlib.colors import ListedColormap

    from ftlab.core.plotting import new_figure, save_figure
    from ftlab.dln.regimes import REGIME_COLORS

    names = ["I", "II", "III", "IV"]
    ov = np.sort(df["overlap"].unique())
    ra = np.sort(df["ratio"].unique())
    Z = np.full((len(ra), len(ov)), np.nan)
    for _, r in df.iterrows():
        if r["best"] in names:
            Z[np.searchsorted(ra, r["ratio"]), np.searchsorted(ov, r["overlap"])] = names.index(r["best"])
    fig, ax = new_figure(size=(5.0, 4.0))
    cmap = ListedColormap([REGIME_COLORS[n] for n in names])  # the same colour per regime in every figure
    mesh = ax.pcolormesh(ov, ra, Z, cmap=cmap, vmin=-0.5, vmax=3.5, shading="nearest")
    ax.set_yscale("log")
    ax.set_xlabel(r"overlap $\omega$")
    ax.set_ylabel(r"$\rho_{FT}/\rho_{PT}$")
    ax.set_title(title, fontsize=9)
    cb = fig.colorbar(mesh, ax=ax, ticks=range(4))
    cb.ax.set_yticklabels(names)
    save_figure(fig, path)
