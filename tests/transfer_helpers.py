"""Helpers shared by the transfer tests (a plain module: `pythonpath = ["tests"]` in pyproject.toml)."""

from __future__ import annotations

import copy
import re

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


STAGE_LINE = re.compile(r"ftlab: .*: (started|done in .*|stopped after .*|\d+(/\d+)? after .*)$")


def run_cli(capsys, *args, stages: bool = True) -> tuple[int, str, list[str]]:
    """Exit code, stdout and the stderr lines of one ``ftlab`` command run in-process (``stages=False``: without
    the progress lines of its stages)."""
    from ftlab.cli.main import main

    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    got = capsys.readouterr()
    return code, got.out, [ln for ln in got.err.splitlines() if stages or not STAGE_LINE.match(ln)]
