"""Training, evaluation and per-layer geometry helpers for the deep experiments (plain torch, CPU).

* :func:`train_` -- minibatch SGD (momentum) or AdamW on cross-entropy until the mean training loss
  of an epoch falls below ``loss_tol`` (as in Lippl & Lindsey 2024, who stop at 1e-2) or a step
  budget runs out; returns a :class:`TrainResult` (``converged``, ``n_iter``, ``residual``).
* :func:`accuracy` -- top-1 accuracy in eval mode.
* :func:`recalibrate_batchnorm_` -- recompute BatchNorm running statistics on given inputs.
* :func:`layer_activations` -- activations of named modules, captured with forward hooks that are
  always removed.
* :func:`layer_geometry` -- PR before/after, ENSD and linear CKA per layer of two models
  (:mod:`ftlab.metrics`).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ftlab.metrics import ensd, linear_cka, participation_ratio
from ftlab.validate import check_choice, check_int, check_nonnegative, check_positive

__all__ = ["TrainResult", "train_", "accuracy", "recalibrate_batchnorm_", "layer_activations", "layer_geometry",
           "capture"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainResult:
    """converged: the epoch-mean training loss reached ``loss_tol``; n_iter: optimizer steps;
    residual: last epoch-mean training loss (nats); epochs: epochs started."""

    converged: bool
    n_iter: int
    residual: float
    epochs: int


def train_(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    lr: float,
    max_steps: int,
    batch_size: int = 128,
    optimizer: str = "sgd",
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    loss_tol: float = 1e-2,
    seed: int = 0,
) -> TrainResult:
    """Train ``model`` in place on ``(X, y)`` with cross-entropy; see module docs.

    X : inputs ``(n, ...)``; y : int64 labels ``(n,)``. Batches are ``min(batch_size, n)`` rows of a
    fresh permutation per epoch (``seed`` drives it; the global RNG is untouched).
    """
    check_positive("lr", lr)
    max_steps = check_int("max_steps", max_steps, minimum=1)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    check_choice("optimizer", optimizer, ("sgd", "adamw"))
    check_nonnegative("weight_decay", weight_decay)
    n = int(X.shape[0])
    if n < 1 or y.shape[0] != n:
        raise ValueError(f"X has {n} rows and y {y.shape[0]}: need the same number, at least 1")
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(int(seed))
    bs = min(batch_size, n)
    steps, epochs, last = 0, 0, float("inf")
    model.train()
    while steps < max_steps:
        perm = torch.randperm(n, generator=gen)
        total, count = 0.0, 0
        epochs += 1
        for i in range(0, n - bs + 1, bs):
            idx = perm[i:i + bs]
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(X[idx]), y[idx])
            if not torch.isfinite(loss):
                log.warning("training diverged at step %d (loss %s)", steps, float(loss))
                model.eval()
                return TrainResult(False, steps, float("inf"), epochs)
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
            count += len(idx)
            steps += 1
            if steps >= max_steps:
                break
        last = total / max(count, 1)
        if last < loss_tol:
            break
    model.eval()
    return TrainResult(bool(last < loss_tol), steps, float(last), epochs)


@torch.no_grad()
def accuracy(model: nn.Module, X: torch.Tensor, y: torch.Tensor, *, batch_size: int = 500) -> float:
    """Top-1 accuracy of ``model`` (eval mode) on ``(X, y)``, a fraction in [0, 1]."""
    model.eval()
    correct = 0
    for i in range(0, int(X.shape[0]), batch_size):
        correct += int((model(X[i:i + batch_size]).argmax(1) == y[i:i + batch_size]).sum())
    return correct / max(int(X.shape[0]), 1)


@torch.no_grad()
def recalibrate_batchnorm_(model: nn.Module, X: torch.Tensor, *, batch_size: int | None = None) -> int:
    """Reset every BatchNorm layer's running mean/variance and recompute them on ``X``; leaves the
    model in eval mode. ``batch_size=None`` (default) uses one pass over all of ``X`` (the exact
    statistics of ``X``); otherwise the per-batch statistics are averaged with equal weights
    (PyTorch's cumulative average, ``momentum=None``).

    Needed after rescaling a BatchNorm network: a rescale changes the activations but not the
    running statistics collected before it, and a short fine-tuning run does not refresh them, so
    eval-mode outputs would be mis-normalized. Returns the number of BatchNorm layers recalibrated.
    """
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [m.momentum for m in bns]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None
    try:
        model.train()
        bs = int(X.shape[0]) if batch_size is None else check_int("batch_size", batch_size, minimum=1)
        for i in range(0, int(X.shape[0]), bs):
            model(X[i:i + bs])
    finally:
        for m, mom in zip(bns, saved):
            m.momentum = mom
        model.eval()
    return len(bns)


@contextmanager
def capture(model: nn.Module, layers: list[str]):
    """Context manager yielding ``{layer: [output tensors]}`` filled by forward hooks on ``layers``;
    the hooks are removed on exit, even after an error."""
    mods = dict(model.named_modules())
    missing = [n for n in layers if n not in mods]
    if missing:
        raise ValueError(f"model has no module {missing[0]!r} to capture")
    store: dict[str, list[torch.Tensor]] = {n: [] for n in layers}
    handles = [mods[n].register_forward_hook(lambda _m, _i, out, n=n: store[n].append(out.detach()))
               for n in layers]
    try:
        yield store
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def layer_activations(model: nn.Module, X: torch.Tensor, layers: list[str], *, batch_size: int = 500
                      ) -> dict[str, np.ndarray]:
    """Outputs of the named modules on ``X`` in eval mode, flattened to float64 ``(n, features)``."""
    model.eval()
    with capture(model, layers) as store:
        for i in range(0, int(X.shape[0]), batch_size):
            model(X[i:i + batch_size])
    return {n: torch.cat(v).reshape(int(X.shape[0]), -1).double().numpy() for n, v in store.items()}


def layer_geometry(pre: nn.Module, post: nn.Module, X: torch.Tensor, layers: list[str], *, center: bool = False
                   ) -> list[dict]:
    """Per layer: ``pr_pre``, ``pr_post`` (participation ratios), ``ensd`` (pre vs post, feature
    space) and ``cka`` (linear, biased) of the two models' activations on the same inputs ``X``."""
    a = layer_activations(pre, X, layers)
    b = layer_activations(post, X, layers)
    rows = []
    for n in layers:
        rows.append({
            "layer": n,
            "pr_pre": participation_ratio(a[n], center=center),
            "pr_post": participation_ratio(b[n], center=center),
            "ensd": ensd(a[n], b[n], center=center),
            "cka": linear_cka(a[n], b[n]),
        })
    return rows
