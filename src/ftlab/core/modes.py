"""Temporary module modes: train/eval flags and ``requires_grad``, each restored exactly on exit.

``model.eval()`` followed by ``model.train(was_training)`` is not a restore: it sets *every*
submodule to the model's own flag, so a submodule that was deliberately in eval mode (a frozen
BatchNorm inside a model being trained) comes back in train mode. :func:`module_mode` records
each module's flag and puts each one back, also when the block raises.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

__all__ = ["module_mode", "requires_grad"]


@contextlib.contextmanager
def module_mode(model: nn.Module, *, train: bool = False) -> Iterator[nn.Module]:
    """Every module of ``model`` in eval mode (``train=True``: train mode) inside the block.

    On exit each module gets back its own ``training`` flag, whatever the block did to them.
    """
    flags = [(m, m.training) for m in model.modules()]
    try:
        model.train(train)
        yield model
    finally:
        for m, flag in flags:
            m.training = flag


@contextlib.contextmanager
def requires_grad(model: nn.Module, enabled: bool = True) -> Iterator[nn.Module]:
    """Every parameter of ``model`` with ``requires_grad=enabled`` inside the block; each flag restored on exit."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(enabled)
        yield model
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
