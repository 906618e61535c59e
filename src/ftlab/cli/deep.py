"""``ftlab deep``: init-scale interventions and representation geometry on deep networks."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from ftlab.cli.output import emit, format_option
from ftlab.core.results import staged_output

_CTX = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
_SHOW = ["level", "claim", "arch", "task", "knob", "when", "effect", "ci_low", "ci_high", "p_holm", "seeds", "verdict"]


def _seeds(value: str | None):
    if value is None:
        return None
    try:
        seeds = tuple(int(s) for s in value.split(",") if s.strip())
    except ValueError as exc:
        raise ValueError(f"--seeds={value!r} is invalid: must be comma-separated integers, e.g. 0,1,2") from exc
    if not seeds:
        raise ValueError(f"--seeds={value!r} is invalid: give at least one seed")
    for s in seeds:
        if s < 0:  # the range of `ftlab reproduce --seed`
            raise ValueError(f"--seeds={value!r}: seed {s} is out of range: must be an integer >= 0")
    return seeds


def _records(table) -> list[dict]:
    return [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k in _SHOW}
            for r in table.to_dict("records")]


@click.group(context_settings=_CTX)
def deep():
    """Initialization-scale interventions on real networks, and representation geometry.

    \b
    The deep-network analogues of the diagonal theory's knobs (Anguita et al. 2026):
      kappa  relative scale: an exact, function-preserving move of weight norm from the early
             layers to the readout (kappa < 1 ~ lambda < 0), ftlab.deep.rebalance_
      s      absolute scale: every weight x s (~ c_PT), ftlab.deep.absolute_scale_
      gamma  scale of the fresh readout at the start of fine-tuning (~ gamma_FT)
      b      Transformer balancedness (|W_in|^2 - |W_U|^2) / (|W_in|^2 + |W_U|^2), set by a
             function-preserving rescale of the residual stream, ftlab.deep.set_balancedness_

    \b
    Examples:
      ftlab deep vision --out runs/vision               # quick run, both architectures (minutes)
      ftlab deep vision --full --out runs/vision-full   # the full run's seeds and grids (docs/deep.md)
      ftlab deep modular --out runs/modular             # Transformer on (a + b) mod 30
      ftlab deep claims docs/deep-seeds --out runs/re   # the recorded run's verdicts and figures, no training
      ftlab deep geometry pre.npy post.npy --center     # PR, ENSD, CKA of two arrays
    """


def _sweep_options(f):
    f = click.option("--scheduler", default=None, help="Dask scheduler address (tcp://host:port).")(f)
    f = click.option("--workers", type=click.IntRange(min=1), default=None,
                     help="Local worker processes (default: all cores).")(f)
    f = click.option("--seeds", default=None, help="Comma-separated evaluation seeds (default: the protocol's).")(f)
    f = click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
                     help="Folder for tables, checkpoints, figures and claims.csv (reruns resume; the tables, "
                          "claims.csv and figures of a run replace the previous ones as a whole).")(f)
    f = click.option("--full", is_flag=True, help="The full protocol (seeds chosen by power, full grids; docs/deep.md).")(f)
    return f


@deep.command(context_settings=_CTX)
@_sweep_options
@click.option("--arch", "archs", multiple=True, type=click.Choice(["resnet18", "nf_resnet18"]),
              help="Architecture(s) (repeatable; default both).")
@click.option("--width", type=click.IntRange(min=1), default=None, help="Network width (stem channels).")
@format_option
def vision(full, out, seeds, workers, scheduler, archs, width, fmt):
    """Pretrain, intervene (kappa, s, gamma; one at a time) and fine-tune two vision networks.

    \b
    (a) ResNet-18 with BatchNorm and (b) the same without normalization and biases, pretrained on
    8 Fashion-MNIST classes, fine-tuned on 2 of them, on the 2 held-out classes and on MNIST.
    Writes OUT/vision_*.csv, OUT/claims.csv (claims 1-4: primaries, secondary rows, ftlab's own) and the
    figures.
    Example:  ftlab deep vision --out runs/vision --arch nf_resnet18 --seeds 0,1,2,3
    """
    from ftlab.experiments.deep_claims import vision as V
    from ftlab.experiments.deep_claims.pipeline import judge, run_vision_part

    proto, grid = V.FULL if full else V.QUICK
    changes = {k: v for k, v in dict(width=width, archs=tuple(archs) or None).items() if v is not None}
    proto = dataclasses.replace(proto, **changes)
    if seeds is not None:
        grid = dataclasses.replace(grid, seeds=_seeds(seeds))
    _check_vision_memory(proto, workers, scheduler, width)
    # locked (a second run on the same --out is refused); the sweep stores in OUT resume, the tables, claims and
    # figures replace the previous ones as one output set
    with staged_output(out, name="vision") as stage:
        tables = run_vision_part(out, proto=proto, grid=grid, workers=workers, scheduler=scheduler, tables_dir=stage)
        res = judge(stage, tables, None, gamma_default=proto.gamma_default, geometry_at=proto.geometry_at,
                    stages=proto.stages)
    emit(_records(res.claims), fmt)


def _check_vision_memory(proto, workers, scheduler, width) -> None:
    """Refuse, before any work, a vision run whose networks and batches cannot fit in memory (naming --width)."""
    from ftlab.core.validate import check_memory
    from ftlab.experiments.deep_claims.pipeline import vision_memory

    what = f"--width {proto.width}" + ("" if width is not None else " (the protocol's)")
    check_memory(what, vision_memory(proto, workers=workers, scheduler=scheduler),
                 hint="reduce --width or --workers")


@deep.command(context_settings=_CTX)
@_sweep_options
@click.option("--when", "whens", multiple=True, type=click.Choice(["init", "post"]),
              help="Set balancedness at initialization and/or on the pretrained network (default both).")
@format_option
def modular(full, out, seeds, workers, scheduler, whens, fmt):
    """Transformer: pretrain on (a + b) mod 30, fine-tune on (a + b) mod p over balancedness.

    \b
    p in {3, 5, 10} reuse the prime factors of 30; p in {7, 11, 14} bring a new one. Writes
    OUT/modular_*.csv, OUT/fig_claim5_balancedness.png and OUT/claims.csv (claim 5).
    Example:  ftlab deep modular --out runs/modular --seeds 0,1,2,3,4 --when post
    """
    from ftlab.experiments.deep_claims import modular as M
    from ftlab.experiments.deep_claims.pipeline import judge, run_modular_part

    proto, grid = M.FULL if full else M.QUICK
    if whens:
        grid = dataclasses.replace(grid, whens=tuple(whens))
    if seeds is not None:
        grid = dataclasses.replace(grid, seeds=_seeds(seeds))
    with staged_output(out, name="modular") as stage:  # as for `ftlab deep vision`
        tables = run_modular_part(out, proto=proto, grid=grid, workers=workers, scheduler=scheduler, tables_dir=stage)
        res = judge(stage, None, tables)
    emit(_records(res.claims), fmt)


@deep.command(context_settings=_CTX)
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write claims.csv, primaries.csv and the figures here (default: FOLDER-recomputed, beside FOLDER; "
                   "never FOLDER itself or a folder inside it).")
@click.option("--level", type=click.Choice(["primary", "secondary", "ftlab", "all"]), default="all", show_default=True,
              help="Which rows to show: the primaries, the secondary rows, ftlab's own findings, or all.")
@format_option
def claims(folder, out, level, fmt):
    """Recompute every verdict and figure from the tables saved in FOLDER, without training.

    \b
    FOLDER is a run folder or the compact per-seed tables of a recorded run (docs/deep-seeds:
    vision_ft.csv, vision_pt.csv, modular_ft.csv, modular_pt.csv; either part may be absent).
    FOLDER is only read. Writes OUT/claims.csv (primaries, then secondary rows, then ftlab's own
    findings), OUT/primaries.csv (the declared tests) and the figures, as one whole: they replace
    the previous ones of OUT together, and files of an earlier run that this one lacks are removed.
    Examples:
      ftlab deep claims runs/vision --level primary      # writes runs/vision-recomputed
      ftlab deep claims docs/deep-seeds --out results/deep-recomputed
    """
    from ftlab.experiments.deep_claims.pipeline import verdicts_from_folder

    if out is None:
        place = folder.resolve()
        out = place.parent / f"{place.name}-recomputed"
    res = verdicts_from_folder(folder, out=out)
    emit(_records(res.claims if level == "all" else res.level(level)), fmt)


def _load_array(path: Path):
    """A .npy array as float64 (n_samples, n_features); one-line errors for unreadable, empty or non-finite input."""
    import numpy as np

    try:
        a = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {path} as a .npy array without pickle: {exc}") from None
    if not isinstance(a, np.ndarray) or a.dtype.kind not in "biuf":
        raise ValueError(f"{path} holds {getattr(a, 'dtype', type(a).__name__)} values, not numbers")
    if a.ndim < 2 or a.shape[0] < 2 or a.size == 0:
        raise ValueError(f"{path} has shape {a.shape}: need (n_samples >= 2, n_features >= 1)")
    a = a.reshape(len(a), -1).astype(np.float64)
    if not np.isfinite(a).all():
        raise ValueError(f"{path} holds non-finite values ({int((~np.isfinite(a)).sum())} of {a.size})")
    return a


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
    from ftlab.core.geometry import ensd, linear_cka, participation_ratio

    X = _load_array(x_path)
    rec = {"pr_x": participation_ratio(X, center=center)}
    if y_path is not None:
        Y = _load_array(y_path)
        same_features, same_samples = X.shape[1] == Y.shape[1], len(X) == len(Y)
        if not (same_features or same_samples):
            raise ValueError(f"{x_path} is {X.shape[0]} x {X.shape[1]} and {y_path} is {Y.shape[0]} x {Y.shape[1]}: "
                             "ENSD needs the same samples or the same features, CKA the same samples")
        rec["pr_y"] = participation_ratio(Y, center=center)
        rec["ensd"] = ensd(X, Y, center=center) if same_features else ensd(X, Y, center=center, space="samples")
        if same_samples:
            rec["cka"] = linear_cka(X, Y)
            if len(X) >= 4:
                rec["cka_unbiased"] = linear_cka(X, Y, unbiased=True)
    emit([rec], fmt)
