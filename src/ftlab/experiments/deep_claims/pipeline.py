"""Run the deep experiments end to end: sweeps -> tables -> figures -> claim verdicts.

Used by ``ftlab deep resnet|modular`` and by the ``deep`` section of ``ftlab reproduce``. Writes,
under ``out_dir``: ``resnet_pt.csv``, ``resnet_ft.csv``, ``modular_pt.csv``, ``modular_ft.csv``
(each with a ``.meta.json`` sidecar of the protocol), ``claims.csv``, and the figures
``fig_resnet_accuracy.png``, ``fig_resnet_geometry.png``, ``fig_modular.png``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from ftlab.core.results import save_table
from ftlab.experiments.deep_claims import claims as C
from ftlab.experiments.deep_claims import modular as M
from ftlab.experiments.deep_claims import resnet as R

__all__ = ["FIGURES", "run_resnet_part", "run_modular_part", "write_claims"]

FIGURES = ("fig_resnet_accuracy", "fig_resnet_geometry", "fig_modular")


def _params(proto, grid) -> dict:
    return {"protocol": dataclasses.asdict(proto), "grid": dataclasses.asdict(grid)}


def run_resnet_part(out_dir, *, proto: R.ResNetProtocol, grid: R.ResNetGrid, workers=None, scheduler=None,
                    figures=None) -> tuple[pd.DataFrame, pd.DataFrame, list[C.Claim]]:
    """ResNet sweeps, tables, figures; returns ``(pt, ft, claims)``."""
    out = Path(out_dir)
    pt, ft = R.run_resnet(proto, grid, out, workers=workers, scheduler=scheduler)
    save_table(pt, out / "resnet_pt.csv", params=_params(proto, grid), seed=int(grid.seeds[0]))
    save_table(ft, out / "resnet_ft.csv", params=_params(proto, grid), seed=int(grid.seeds[0]))
    if figures is None or "fig_resnet_accuracy" in figures:
        C.plot_resnet_accuracy(ft, out / "fig_resnet_accuracy.png")
    if figures is None or "fig_resnet_geometry" in figures:
        C.plot_resnet_geometry(ft, out / "fig_resnet_geometry.png")
    return pt, ft, C.resnet_claims(ft, gamma_default=proto.gamma_default)


def run_modular_part(out_dir, *, proto: M.ModularProtocol, grid: M.ModularGrid, workers=None, scheduler=None,
                     figures=None) -> tuple[pd.DataFrame, pd.DataFrame, list[C.Claim]]:
    """Modular-arithmetic sweeps, tables, figure; returns ``(pt, ft, claims)``."""
    out = Path(out_dir)
    pt, ft = M.run_modular(proto, grid, out, workers=workers, scheduler=scheduler)
    save_table(pt, out / "modular_pt.csv", params=_params(proto, grid), seed=int(grid.seeds[0]))
    save_table(ft, out / "modular_ft.csv", params=_params(proto, grid), seed=int(grid.seeds[0]))
    if figures is None or "fig_modular" in figures:
        C.plot_modular(ft, out / "fig_modular.png")
    return pt, ft, C.modular_claims(ft)


def write_claims(claims: list[C.Claim], path) -> pd.DataFrame:
    """Save the verdicts (columns of docs/deep-claims.csv plus ``definition``); returns the table."""
    table = C.claims_table(claims)
    save_table(table, path)
    return table
