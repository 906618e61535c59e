"""Helpers shared by the transfer tests (a plain module: `pythonpath = ["tests"]` in pyproject.toml)."""

from __future__ import annotations

import copy

import torch
from torch import nn


def perturbed(model: nn.Module, seed: int = 3, scale: float = 0.05) -> nn.Module:
    """A deep copy of ``model`` with seeded Gaussian noise of standard deviation ``scale`` on every parameter
    (a stand-in for a fine-tuning)."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return out
