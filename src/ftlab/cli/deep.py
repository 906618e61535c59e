"""``ftlab deep``: init-scale interventions and representation geometry on deep networks."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from ftlab.cli.output import emit, format_option

_CTX = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _seeds(value: str | None):
    if value is None:
        return None
    try:
        seeds = tuple(int(s) for s in value.split(",") if s.strip())
    except ValueError as exc:
        raise ValueError(f"--seeds={value!r} is invalid: must be comma-separated integers, e.g. 0,1,2") from exc
    if not seeds:
        raise ValueError(f"--seeds={value!r} is invalid: give at least one seed")
    return seeds


def _claims_records(claims) -> list[dict]:
    return [{"claim": c.claim, "verdict": c.verdict, "effect": round(c.effect, 4), "ci_low": round(c.ci_low, 4),
             "ci_high": round(c.ci_high, 4), "seeds": c.seeds} for c in claims]


@click.group(context_settings=_CTX)
def deep():
    """Initialization-scale interventions on real networks, and representation geometry.

    \b
    The deep-network analogues of the diagonal theory's knobs (Anguita et al. 2026):
      kappa  relative scale: early layers x kappa, late layers x 1/kappa (kappa < 1 ~ lambda < 0)
      s      absolute scale: every weight x s (~ c_PT)
      gamma  scale of the re-initialized readout before fine-tuning (~ gamma_FT)
      b      Transformer balancedness (||W_E||^2 - ||W_U||^2) / (||W_E||^2 + ||W_U||^2)
    In Python: ftlab.deep.interventions (relative_scale_, absolute_scale_, reinit_readout_,
    set_balancedness_) and ftlab.core.geometry (participation_ratio, ensd, linear_cka).

    \b
    Examples:
      ftlab deep resnet --out runs/resnet              # quick ResNet sweep (minutes)
      ftlab deep resnet --full --width 16 --workers 16  # larger protocol, wider nets
      ftlab deep modular --out runs/modular             # Transformer on (a + b) mod 30
      ftlab deep claims runs/resnet                     # verdicts from saved tables
      ftlab deep geometry pre.npy post.npy --center     # PR, ENSD, CKA of two arrays
    """


def _sweep_options(f):
    f = click.option("--scheduler", default=None, help="Dask scheduler address (tcp://host:port).")(f)
    f = click.option("--workers", type=click.IntRange(min=1), default=None,
                     help="Local worker processes (default: all cores).")(f)
    f = click.option("--seeds", default=None, help="Comma-separated seeds (default: the protocol's).")(f)
    f = click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
                     help="Folder for tables, checkpoints, figures and claims.csv (reruns resume).")(f)
    f = click.option("--full", is_flag=True,
                     help="The larger protocol (about 1-2 h on 2 cores; docs/deep.md) instead of the quick one.")(f)
    return f


@deep.command(context_settings=_CTX)
@_sweep_options
@click.option("--width", type=click.IntRange(min=1), default=None, help="ResNet width (stem channels).")
@click.option("--when", type=click.Choice(["after_pt", "init"]), default=None,
              help="Apply kappa and s after pretraining (default) or at initialization before it.")
@click.option("--kappa-mode", type=click.Choice(["both", "early"]), default=None,
              help="kappa scales early x kappa and late x 1/kappa (both) or early only.")
@format_option
def resnet(full, out, seeds, workers, scheduler, width, when, kappa_mode, fmt):
    """Pretrain a ResNet-18 on Fashion-MNIST, intervene, fine-tune over n_FT; print the verdicts.

    \b
    Fine-tuning tasks: the 2 Fashion-MNIST classes held out of pretraining, and MNIST (the
    offline stand-in for SVHN). Writes OUT/resnet_ft.csv, figures and OUT/claims.csv.
    Example:  ftlab deep resnet --out runs/resnet --seeds 0,1,2,3 --when init
    """
    from ftlab.experiments.deep_claims import resnet as R
    from ftlab.experiments.deep_claims.pipeline import run_resnet_part, write_claims

    proto, grid = R.FULL if full else R.QUICK
    changes = {k: v for k, v in dict(width=width, when=when, kappa_mode=kappa_mode).items() if v is not None}
    proto = dataclasses.replace(proto, **changes)
    if seeds is not None:
        grid = dataclasses.replace(grid, seeds=_seeds(seeds))
    _, _, claims = run_resnet_part(out, proto=proto, grid=grid, workers=workers, scheduler=scheduler)
    write_claims(claims, out / "claims.csv")
    emit(_claims_records(claims), fmt)


@deep.command(context_settings=_CTX)
@_sweep_options
@click.option("--when", type=click.Choice(["ft_start", "init"]), default=None,
              help="Set balancedness at the start of fine-tuning (default) or before pretraining.")
@format_option
def modular(full, out, seeds, workers, scheduler, when, fmt):
    """Transformer: pretrain on (a + b) mod 30, fine-tune on (a + b) mod p over balancedness.

    \b
    p = 3, 5 reuse the factors of 30; p = 7, 11 are new primes. Writes OUT/modular_ft.csv,
    OUT/fig_modular.png and OUT/claims.csv.
    Example:  ftlab deep modular --out runs/modular --seeds 0,1,2,3,4
    """
    from ftlab.experiments.deep_claims import modular as M
    from ftlab.experiments.deep_claims.pipeline import run_modular_part, write_claims

    proto, grid = M.FULL if full else M.QUICK
    if when is not None:
        proto = dataclasses.replace(proto, when=when)
    if seeds is not None:
        grid = dataclasses.replace(grid, seeds=_seeds(seeds))
    _, _, claims = run_modular_part(out, proto=proto, grid=grid, workers=workers, scheduler=scheduler)
    write_claims(claims, out / "claims.csv")
    emit(_claims_records(claims), fmt)


@deep.command(context_settings=_CTX)
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@format_option
def claims(folder, fmt):
    """Recompute the claim verdicts from the tables saved in FOLDER.

    \b
    Reads FOLDER/resnet_ft.csv and/or FOLDER/modular_ft.csv (either may be absent).
    Example:  ftlab deep claims results/deep --format csv
    """
    from ftlab.core.results import load_table
    from ftlab.experiments.deep_claims import claims as C

    found = []
    if (folder / "resnet_ft.csv").exists():
        ft, meta = load_table(folder / "resnet_ft.csv")
        gamma = (meta.get("params") or {}).get("protocol", {}).get("gamma_default", 1.0)
        found += C.resnet_claims(ft, gamma_default=gamma)
    if (folder / "modular_ft.csv").exists():
        found += C.modular_claims(load_table(folder / "modular_ft.csv")[0])
    if not (folder / "resnet_ft.csv").exists() and not (folder / "modular_ft.csv").exists():
        raise FileNotFoundError(f"{folder} holds neither resnet_ft.csv nor modular_ft.csv")
    emit(_claims_records(found), fmt)


@deep.command(context_settings=_CTX)
@click.argument("x_path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("y_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=False)
@click.option("--center", is_flag=True, help="Subtract feature means before PR and ENSD.")
@format_option
def geometry(x_path, y_path, center, fmt):
    """PR of X (and of Y), ENSD(X, Y) and linear CKA (biased, unbiased) of two .npy arrays.

    \b
    Arrays are (n_samples, n_features) (more axes are flattened after the first).
    Examples:
      ftlab deep geometry acts.npy                     # participation ratio only
      ftlab deep geometry pre.npy post.npy --center --format json
    """
    import numpy as np

    from ftlab.core.geometry import ensd, linear_cka, participation_ratio

    X = np.load(x_path, allow_pickle=False)
    rec = {"pr_x": participation_ratio(X, center=center)}
    if y_path is not None:
        Y = np.load(y_path, allow_pickle=False)
        rec["pr_y"] = participation_ratio(Y, center=center)
        if X.reshape(len(X), -1).shape[1] == Y.reshape(len(Y), -1).shape[1]:
            rec["ensd"] = ensd(X, Y, center=center)
        elif len(X) == len(Y):
            rec["ensd"] = ensd(X, Y, center=center, space="samples")
        if len(X) == len(Y):
            rec["cka"] = linear_cka(X, Y)
            if len(X) >= 4:
                rec["cka_unbiased"] = linear_cka(X, Y, unbiased=True)
    emit([rec], fmt)
