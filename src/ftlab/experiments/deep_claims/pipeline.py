"""Run the deep experiments end to end: sweeps -> tables -> verdicts -> figures.

Used by ``ftlab deep vision|modular|claims`` and by the ``deep`` section of ``ftlab reproduce``.
Writes, under ``out_dir``: ``vision_{pt_tune,pt,ft_tune,ft}.csv``, ``vision_elr.csv``,
``modular_{pt_tune,pt,ft_tune,ft}.csv`` (each with a ``.meta.json`` sidecar holding the protocol
and grid), ``claims.csv`` (the primaries, then the secondary rows, then ftlab's own findings; the
columns of docs/deep-claims.csv), ``primaries.csv`` (the declared primary tests) and the figures of
:data:`ftlab.experiments.deep_claims.figures.FIGURES`. :func:`export_tables` writes the compact
per-seed tables a run's verdicts and figures are recomputed from (:func:`verdicts_from_folder`),
without training.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ftlab.core.results import load_table, save_table
from ftlab.experiments.deep_claims import claims as C
from ftlab.experiments.deep_claims import figures as G
from ftlab.experiments.deep_claims import modular as M
from ftlab.experiments.deep_claims import vision as V

__all__ = ["TABLES", "DeepResult", "export_tables", "judge", "run_modular_part", "run_vision_part",
           "verdicts_from_folder"]

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


def run_vision_part(out_dir, *, proto: V.VisionProtocol, grid: V.VisionGrid, workers=None,
                    scheduler=None) -> dict[str, pd.DataFrame]:
    """Vision sweeps and tables (``vision_*.csv``, ``vision_elr.csv``); returns the tables."""
    out = Path(out_dir)
    tables = V.run_vision(proto, grid, out, workers=workers, scheduler=scheduler)
    tables["elr"] = V.elr_table(proto, grid)
    for name, df in tables.items():
        save_table(df, out / f"vision_{name}.csv", params=_params(proto, grid), seed=int(grid.seeds[0]))
    return tables


def run_modular_part(out_dir, *, proto: M.ModularProtocol, grid: M.ModularGrid, workers=None,
                     scheduler=None) -> dict[str, pd.DataFrame]:
    """Modular-arithmetic sweeps and tables (``modular_*.csv``); returns the tables."""
    out = Path(out_dir)
    tables = M.run_modular(proto, grid, out, workers=workers, scheduler=scheduler)
    for name, df in tables.items():
        save_table(df, out / f"modular_{name}.csv", params=_params(proto, grid), seed=int(grid.seeds[0]))
    return tables


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


def verdicts_from_folder(folder, *, out=None, figures: tuple[str, ...] | None = None) -> DeepResult:
    """Recompute the verdicts and figures (``figures``: a subset of names, ``()`` for none) from the
    tables a run saved in ``folder`` (a run folder, or the compact tables of :func:`export_tables`),
    without training; written to ``out`` (default: ``folder``)."""
    folder = Path(folder)
    vision = modular = None
    kw: dict = {}
    if (folder / "vision_ft.csv").exists():
        ft, meta = load_table(folder / "vision_ft.csv")
        proto = (meta.get("params") or {}).get("protocol", {})
        vision = {"ft": ft}
        for name in ("pt", "elr"):
            if (folder / f"vision_{name}.csv").exists():
                vision[name] = load_table(folder / f"vision_{name}.csv")[0]
        kw = dict(gamma_default=float(proto.get("gamma_default", 1.0)), geometry_at=proto.get("geometry_at"),
                  stages=tuple(proto.get("stages", ())))
    if (folder / "modular_ft.csv").exists():
        modular = {"ft": load_table(folder / "modular_ft.csv")[0]}
        if (folder / "modular_pt.csv").exists():
            modular["pt"] = load_table(folder / "modular_pt.csv")[0]
    if vision is None and modular is None:
        raise FileNotFoundError(f"{folder} holds neither vision_ft.csv nor modular_ft.csv")
    return judge(folder if out is None else out, vision, modular, figures=figures, **kw)
