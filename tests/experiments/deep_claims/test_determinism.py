"""The quick deep run is deterministic for its seeds: two fresh runs in two folders give the same tables."""


import pandas as pd
import pytest
import torch

from ftlab.experiments.deep_claims import modular as M
from ftlab.experiments.deep_claims import vision as V
from ftlab.experiments.deep_claims.pipeline import run_modular_part, run_vision_part

PROTO = V.VisionProtocol(width=2, n_pt=32, pt_epochs=1, pt_lrs=(0.05,), pt_tune_epochs=1, ft_lrs=(0.05,),
                         ft_max_steps=3, ft_tune_n=8, n_test=20, n_geometry=8, geometry_at=6, archs=("nf_resnet18",))
GRID = V.VisionGrid(seeds=(0,), tasks=("mnist",), n_ft=(6,), kappa=(0.5,), s=(0.5,), gamma=(0.1,))


def _without_timing(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=[c for c in df.columns if c.endswith("cpu_s") or c.endswith("time_s")]).reset_index(drop=True)


@pytest.mark.usefixtures("tiny_images")
def test_two_fresh_vision_runs_give_identical_tables(tmp_path):
    torch.set_num_threads(1)
    a = run_vision_part(tmp_path / "a", proto=PROTO, grid=GRID, workers=1)
    b = run_vision_part(tmp_path / "b", proto=PROTO, grid=GRID, workers=1)
    for key in ("pt", "ft"):
        assert len(a[key]) > 0
        pd.testing.assert_frame_equal(_without_timing(a[key]), _without_timing(b[key]), check_exact=True)


def test_two_fresh_modular_runs_give_identical_tables(tmp_path):
    torch.set_num_threads(1)
    proto = M.ModularProtocol(modulus=6, d_model=8, n_heads=2, d_mlp=8, lrs=(1e-2,), pt_steps=3, ft_steps=3, tune_p=5)
    grid = M.ModularGrid(seeds=(0,), reuse=(3,), new=(5,), balancedness=(-0.5, 0.0))
    a = run_modular_part(tmp_path / "a", proto=proto, grid=grid, workers=1)
    b = run_modular_part(tmp_path / "b", proto=proto, grid=grid, workers=1)
    assert len(a["ft"]) > 0
    pd.testing.assert_frame_equal(_without_timing(a["ft"]), _without_timing(b["ft"]), check_exact=True)
