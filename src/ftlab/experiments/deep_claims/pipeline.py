"""Run the deep experiments end to end: sweeps -> tables -> verdicts -> figures.

Used by ``ftlab deep vision|modular|claims`` and by the ``deep`` section of ``ftlab reproduce``.
Writes, under ``out_dir``: ``vision_{pt_tune,pt,ft_tune,ft}.csv``, ``vision_elr.csv``,
``modular_{pt_tune,pt,ft_tune,ft}.csv`` (each with a ``.meta.json`` sidecar holding the protocol
and grid), ``claims.csv`` (the paper's claims, columns of docs/deep-claims.csv plus ``definition``
and ``margin``), ``claims_own.csv`` (ftlab's own findings), and the figures of
:data:`ftlab.experiments.deep_claims.figures.FIGURES`.
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

__all__ = ["DeepResult", "judge", "run_modular_part", "run_vision_part", "verdicts_from_folder"]


@dataclass(frozen=True)
class DeepResult:
    """The paper's claims table, ftlab's own findings and the run's tables (by name)."""

    claims: pd.DataFrame
    own: pd.DataFrame
    tables: dict[str, pd.DataFrame]


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
    """Verdicts (``claims.csv``, ``claims_own.csv``) and figures from the tables of either part."""
    out = Path(out_dir)
    paper: list[C.Row] = []
    own: list[C.Row] = []
    if vision is not None:
        p, o = C.vision_effects(vision["ft"], vision.get("pt"), gamma_default=gamma_default, geometry_at=geometry_at)
        paper += p
        own += o
    if modular is not None:
        paper += C.modular_effects(modular["ft"], modular.get("pt"))
    claims, own_t = C.claims_table(paper), C.claims_table(own)
    save_table(claims, out / "claims.csv")
    save_table(own_t, out / "claims_own.csv")

    def want(name: str) -> bool:
        return figures is None or name in figures

    if vision is not None:
        ft = vision["ft"]
        if want("fig_claim1_kappa"):
            G.plot_knob(ft, "kappa", out / "fig_claim1_kappa.png")
        if want("fig_claim2_s"):
            G.plot_knob(ft, "s", out / "fig_claim2_s.png")
        if want("fig_claim3_gamma"):
            G.plot_gamma(ft, out / "fig_claim3_gamma.png", gamma_default=gamma_default)
        if want("fig_claim4_signature"):
            G.plot_signature(claims, out / "fig_claim4_signature.png")
        if want("fig_accuracy"):
            G.plot_accuracy(ft, out / "fig_accuracy.png")
        if want("fig_geometry") and stages:
            G.plot_geometry(ft, out / "fig_geometry.png", stages)
    if modular is not None and want("fig_claim5_balancedness"):
        G.plot_balancedness(modular["ft"], out / "fig_claim5_balancedness.png")
    tables = {f"vision_{k}": v for k, v in (vision or {}).items()} | {f"modular_{k}": v for k, v in (modular or {}).items()}
    return DeepResult(claims, own_t, tables)


def verdicts_from_folder(folder, *, figures: tuple[str, ...] | None = None) -> DeepResult:
    """Recompute the verdicts and figures (``figures``: a subset of names, ``()`` for none) from the
    tables a previous run saved in ``folder``."""
    folder = Path(folder)
    vision = modular = None
    kw: dict = {}
    if (folder / "vision_ft.csv").exists():
        ft, meta = load_table(folder / "vision_ft.csv")
        proto = (meta.get("params") or {}).get("protocol", {})
        vision = {"ft": ft}
        if (folder / "vision_pt.csv").exists():
            vision["pt"] = load_table(folder / "vision_pt.csv")[0]
        kw = dict(gamma_default=float(proto.get("gamma_default", 1.0)), geometry_at=proto.get("geometry_at"),
                  stages=tuple(proto.get("stages", ())))
    if (folder / "modular_ft.csv").exists():
        modular = {"ft": load_table(folder / "modular_ft.csv")[0]}
        if (folder / "modular_pt.csv").exists():
            modular["pt"] = load_table(folder / "modular_pt.csv")[0]
    if vision is None and modular is None:
        raise FileNotFoundError(f"{folder} holds neither vision_ft.csv nor modular_ft.csv")
    return judge(folder, vision, modular, figures=figures, **kw)
