"""Run the deep experiments end to end: sweeps -> tables -> verdicts -> figures.

Used by ``ftlab deep vision|modular|claims`` and by the ``deep`` section of ``ftlab reproduce``.
Writes, under ``out_dir``: ``vision_{pt_tune,pt,ft_tune,ft}.csv``, ``vision_elr.csv``,
``modular_{pt_tune,pt,ft_tune,ft}.csv`` (each with a ``.meta.json`` sidecar holding the protocol
and grid), ``claims.csv`` (the primaries, then the secondary rows, then ftlab's own findings; the
columns of docs/deep-claims.csv), ``primaries.csv`` (the declared primary tests) and the figures of
:data:`ftlab.experiments.deep_claims.figures.FIGURES`. :func:`export_tables` writes the compact
per-seed tables a run's verdicts and figures are recomputed from (:func:`verdicts_from_folder`),
without training. The CLI and the report write each command's tables, verdicts and figures as one whole output
set (:func:`ftlab.core.results.staged_output`); the sweep stores are appended journals, resumed in place.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ftlab.core.results import check_numeric, check_output_place, load_table, save_table, staged_output
from ftlab.experiments.deep_claims import claims as C
from ftlab.experiments.deep_claims import figures as G
from ftlab.experiments.deep_claims import modular as M
from ftlab.experiments.deep_claims import vision as V
from ftlab.experiments.deep_claims.data import N_PT_CLASSES

__all__ = ["REQUIRED", "TABLES", "DeepResult", "export_tables", "judge", "read_folder", "run_modular_part",
           "run_vision_part", "verdicts_from_folder", "vision_memory"]

#: The tables a run's verdicts and figures are recomputed from, and the columns kept by :func:`export_tables`
#: (per-stage geometry columns ``pr_post_c:*``, ``ensd_c:*``, ``cka:*`` are kept too).
TABLES: dict[str, tuple[str, ...]] = {
    "vision_pt_tune": ("arch", "seed", "knob", "value", "lr", "pt_loss", "pt_steps", "pt_converged"),
    "vision_pt": ("arch", "seed", "knob", "value", "lr", "pt_lr_used", "pt_retries", "pt_loss", "pt_steps",
                  "pt_epochs", "pt_converged", "pt_acc"),
    "vision_ft_tune": ("arch", "seed", "task", "n_ft", "knob", "when", "value", "lr", "ft_loss", "ft_steps",
                       "ft_converged", "acc"),
    "vision_ft": ("arch", "seed", "task", "n_ft", "knob", "when", "value", "lr", "ft_lr_used", "ft_retries", "acc",
                  "ft_loss", "ft_steps", "ft_converged", "kappa_stem_factor", "kappa_readout_factor",
                  "kappa_fn_change"),
    "vision_elr": ("arch", "knob", "when", "value", "stage", "weight_factor", "elr_factor"),
    "modular_pt_tune": ("seed", "b_init", "lr", "pt_loss", "pt_steps", "pt_converged"),
    "modular_pt": ("seed", "b_init", "lr", "pt_lr_used", "pt_retries", "pt_loss", "pt_steps", "pt_converged",
                   "pt_acc", "b_after_pt"),
    "modular_ft_tune": ("seed", "p", "when", "b", "lr", "ft_loss", "ft_steps", "ft_converged", "acc"),
    "modular_ft": ("seed", "p", "kind", "when", "b", "lr", "ft_lr_used", "ft_retries", "acc", "ft_loss", "ft_steps",
                   "ft_converged", "b_pt_end", "b_ft_start"),
}
_GEOMETRY = ("pr_post_c:", "ensd_c:", "cka:")

#: What the verdicts and figures read from each table: ``(columns, those of them that hold numbers)``.
REQUIRED: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "vision_ft": (("arch", "seed", "task", "n_ft", "knob", "when", "value", "acc", "ft_loss"),
                  ("seed", "n_ft", "value", "acc", "ft_loss")),
    "vision_pt": (("arch", "seed", "knob", "value", "pt_loss", "pt_converged"), ("seed", "value", "pt_loss")),
    "vision_elr": (("arch", "knob", "when", "value"), ("value",)),
    "modular_ft": (("seed", "p", "kind", "when", "b", "acc", "ft_loss"), ("seed", "p", "b", "acc", "ft_loss")),
    "modular_pt": (("seed", "b_init", "pt_loss", "pt_converged"), ("seed", "pt_loss")),
}


@dataclass(frozen=True)
class DeepResult:
    """The judged table (primaries, secondary rows, ftlab's own findings; ``level`` says which) and the
    run's tables (by name)."""

    claims: pd.DataFrame
    tables: dict[str, pd.DataFrame]

    def level(self, name: str) -> pd.DataFrame:
        """The rows of one level: ``"primary"``, ``"secondary"`` or ``"ftlab"``."""
        return self.claims[self.claims.level == name].reset_index(drop=True)


def _params(proto, grid) -> dict:
    return {"protocol": dataclasses.asdict(proto), "grid": dataclasses.asdict(grid)}


def run_vision_part(out_dir, *, proto: V.VisionProtocol, grid: V.VisionGrid, workers=None, scheduler=None,
                    tables_dir=None) -> dict[str, pd.DataFrame]:
    """Vision sweeps (their stores and checkpoints in ``out_dir``, resumable) and tables (``vision_*.csv``,
    ``vision_elr.csv``, written to ``tables_dir``, default ``out_dir``); returns the tables."""
    out = Path(out_dir)
    tables = V.run_vision(proto, grid, out, workers=workers, scheduler=scheduler)
    tables["elr"] = V.elr_table(proto, grid)
    dest = out if tables_dir is None else Path(tables_dir)
    for name, df in tables.items():
        save_table(df, dest / f"vision_{name}.csv", params=_params(proto, grid), seed=int(grid.seeds[0]))
    return tables


def run_modular_part(out_dir, *, proto: M.ModularProtocol, grid: M.ModularGrid, workers=None, scheduler=None,
                     tables_dir=None) -> dict[str, pd.DataFrame]:
    """Modular-arithmetic sweeps (stores and checkpoints in ``out_dir``) and tables (``modular_*.csv``, written to
    ``tables_dir``, default ``out_dir``); returns the tables."""
    out = Path(out_dir)
    tables = M.run_modular(proto, grid, out, workers=workers, scheduler=scheduler)
    dest = out if tables_dir is None else Path(tables_dir)
    for name, df in tables.items():
        save_table(df, dest / f"modular_{name}.csv", params=_params(proto, grid), seed=int(grid.seeds[0]))
    return tables


def _network_size(arch: str, width: int, side: int) -> tuple[int, int]:
    """``(parameters, activation values per image)`` of a pretraining network, built on the meta device (nothing
    is allocated); activations: the outputs of every leaf module for one ``side`` x ``side`` image."""
    import torch

    acts: list[int] = []
    with torch.device("meta"):
        model = V._model(arch, N_PT_CLASSES, width)
        hooks = [m.register_forward_hook(lambda _m, _i, o: acts.append(o.numel()))
                 for m in model.modules() if not list(m.children())]
        model(torch.empty(1, 1, side, side))
    for h in hooks:
        h.remove()
    return sum(p.numel() for p in model.parameters()), sum(acts)


def vision_memory(proto: V.VisionProtocol, *, workers: int | None = None, scheduler=None) -> float:
    """Bytes a vision run needs at once (a lower estimate): per run, the largest network's weights, gradients,
    momentum and two more copies (the pretrained network and the reference of the geometry), plus one batch's
    activations kept for the backward pass (forward and gradient; the largest of the training batches and the
    geometry images); times the local worker processes (``workers``, default every core; one run when a
    ``scheduler`` runs them elsewhere)."""
    import os

    side = -(-28 // proto.downsample)
    batch = max(proto.pt_batch, proto.ft_batch, proto.n_geometry)
    per_run = 0.0
    for arch in proto.archs:
        n_params, n_acts = _network_size(arch, proto.width, side)
        per_run = max(per_run, 4.0 * (5 * n_params + 2 * batch * n_acts))
    procs = 1 if scheduler is not None else (workers or os.cpu_count() or 1)
    return per_run * procs


def judge(out_dir, vision: dict[str, pd.DataFrame] | None, modular: dict[str, pd.DataFrame] | None, *,
          gamma_default: float = 1.0, geometry_at: int | None = None, stages: tuple[str, ...] = (),
          figures: tuple[str, ...] | None = None) -> DeepResult:
    """Verdicts (``claims.csv``, ``primaries.csv``) and figures from the tables of either part."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[C.Row] = []
    if vision is not None:
        rows += C.vision_rows(vision["ft"], vision.get("pt"), gamma_default=gamma_default, geometry_at=geometry_at)
    if modular is not None:
        rows += C.modular_rows(modular["ft"], modular.get("pt"))
    claims = C.claims_table(rows)
    save_table(claims, out / "claims.csv")
    save_table(C.primaries_table(), out / "primaries.csv")
    G.plot_all(out, claims, rows, vision, modular, gamma_default=gamma_default, geometry_at=geometry_at, stages=stages,
               figures=figures)
    tables = {f"vision_{k}": v for k, v in (vision or {}).items()} | {f"modular_{k}": v for k, v in (modular or {}).items()}
    return DeepResult(claims, tables)


def export_tables(run_dir, dest, *, digits: int = 5) -> list[Path]:
    """Copy a run's tables into ``dest`` as compact per-seed CSVs (the columns of :data:`TABLES` plus the
    per-stage geometry, floats to ``digits`` significant digits, sidecars kept); returns the paths."""
    src, dst = Path(run_dir), Path(dest)
    dst.mkdir(parents=True, exist_ok=True)
    written = []
    for name, cols in TABLES.items():
        if not (src / f"{name}.csv").exists():
            continue
        df, meta = load_table(src / f"{name}.csv")
        keep = [c for c in df.columns if c in cols or c.startswith(_GEOMETRY)]
        df = df[keep].copy()
        for c in df.columns:
            if pd.api.types.is_float_dtype(df[c]):
                df[c] = df[c].map(lambda v: float(f"{v:.{digits}g}") if pd.notna(v) else v)
        params = meta.get("params") or {}
        written.append(save_table(df, dst / f"{name}.csv", params=params, seed=meta.get("seed")))
    if not written:
        raise FileNotFoundError(f"{src} holds none of the deep run's tables ({', '.join(TABLES)})")
    return written


def _read(folder: Path, name: str) -> tuple[pd.DataFrame, dict]:
    """Table ``name`` of ``folder`` with the columns :data:`REQUIRED` names (``ValueError`` naming the file and
    the column otherwise); the per-stage geometry columns that are present must hold numbers too."""
    cols, numeric = REQUIRED[name]
    path = folder / f"{name}.csv"
    df, meta = load_table(path, columns=cols, numeric=numeric)
    check_numeric(df, tuple(c for c in df.columns if str(c).startswith(_GEOMETRY)), path)
    return df, meta


def _protocol(meta: dict, path: Path) -> dict:
    """The settings the verdicts read from a table's sidecar (``params.protocol``), checked for their shape."""
    side = f"{path}.meta.json"
    proto = meta.get("params", {}).get("protocol", {})
    if not isinstance(proto, dict):
        raise ValueError(f"{side}: field 'params.protocol' must be a JSON object, got {type(proto).__name__}")
    gamma, at, stages = proto.get("gamma_default", 1.0), proto.get("geometry_at"), proto.get("stages", [])
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not gamma > 0:
        raise ValueError(f"{side}: field 'params.protocol.gamma_default' must be a positive number, got {gamma!r}")
    if at is not None and (isinstance(at, bool) or not isinstance(at, int)):
        raise ValueError(f"{side}: field 'params.protocol.geometry_at' must be an integer or null, got {at!r}")
    if not isinstance(stages, list) or not all(isinstance(x, str) and x for x in stages):
        raise ValueError(f"{side}: field 'params.protocol.stages' must be a list of stage names, got {stages!r}")
    return dict(gamma_default=float(gamma), geometry_at=at, stages=tuple(stages))


def read_folder(folder) -> tuple[dict | None, dict | None, dict]:
    """The tables a run saved in ``folder`` (a run folder, or the compact tables of :func:`export_tables`):
    ``(vision, modular, settings)``, a part ``None`` when its ``*_ft.csv`` is absent; ``settings`` are the
    keywords of :func:`judge` read from the vision table's sidecar. A missing or non-numeric column and a
    sidecar of the wrong shape are a ``ValueError`` naming the file and the column or field."""
    folder = Path(folder)
    vision = modular = None
    kw: dict = {}
    if (folder / "vision_ft.csv").exists():
        ft, meta = _read(folder, "vision_ft")
        kw = _protocol(meta, folder / "vision_ft.csv")
        geometry = [f"{key}:{s}" for s in kw["stages"] for key in ("pr_post_c", "ensd_c", "cka")]
        if kw["stages"] and f"pr_post_c:{kw['stages'][-1]}" in ft.columns:
            missing = [c for c in geometry if c not in ft.columns]
            if missing:
                raise ValueError(f"{folder / 'vision_ft.csv'}: column {missing[0]!r} is missing (the sidecar's "
                                 f"stages {list(kw['stages'])} need it)")
        vision = {"ft": ft}
        for name in ("pt", "elr"):
            if (folder / f"vision_{name}.csv").exists():
                vision[name] = _read(folder, f"vision_{name}")[0]
    if (folder / "modular_ft.csv").exists():
        modular = {"ft": _read(folder, "modular_ft")[0]}
        if (folder / "modular_pt.csv").exists():
            modular["pt"] = _read(folder, "modular_pt")[0]
    if vision is None and modular is None:
        raise FileNotFoundError(f"{folder} holds neither vision_ft.csv nor modular_ft.csv")
    return vision, modular, kw


def verdicts_from_folder(folder, *, out, figures: tuple[str, ...] | None = None) -> DeepResult:
    """Recompute the verdicts and figures (``figures``: a subset of names, ``()`` for none) from the tables a
    run saved in ``folder`` (:func:`read_folder`), without training, and write them to ``out`` as one whole
    output set named ``claims`` (``claims.csv``, ``primaries.csv``, the figures; :func:`ftlab.core.results.
    staged_output`): a failure or an interrupt leaves the previous set, and files of an earlier set that this
    one lacks are removed. ``out`` may not be, contain or lie inside ``folder`` (``ValueError``); the tables
    are read and checked before anything is created."""
    check_output_place(out, {"FOLDER": folder})
    vision, modular, kw = read_folder(folder)
    with staged_output(out, name="claims") as stage:
        return judge(stage, vision, modular, figures=figures, **kw)
