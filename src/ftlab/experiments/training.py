"""The one training loop and the one evaluation function of ftlab's experiments (plain torch, CPU).

* :class:`TrainConfig` -- a frozen, validated recipe: optimizer (momentum SGD or AdamW), learning
  rate and schedule (constant, or linear warm-up then cosine decay to 0), batch size (``None`` =
  full batch), budget (epochs and/or optimizer steps), gradient clipping, a stopping rule on the
  epoch-mean training loss, and parameter-name prefixes kept frozen.
* :func:`train_` -- trains a model in place with cross-entropy (or a given loss) and returns a
  :class:`TrainResult` (``converged``, ``n_iter``, ``residual``) in the library's solver
  convention.
* :func:`accuracy` -- top-1 accuracy, optionally through a subset of the logits (a task's classes).

Every experiment (the deep-network studies, the transfer benchmark's pretraining and fine-tuning)
trains through :func:`train_`, so a recipe is described by one dataclass and recorded in full.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ftlab.core.modes import module_mode
from ftlab.core.progress import progress
from ftlab.core.validate import check_choice, check_int, check_nonnegative, check_positive, check_range

__all__ = ["TrainConfig", "TrainResult", "accuracy", "n_rows", "take_rows", "train_"]

Inputs = torch.Tensor | Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class TrainConfig:
    """A training recipe.

    optimizer : ``"sgd"`` (momentum SGD; L2 weight decay) or ``"adamw"`` (decoupled weight decay).
    lr : (peak) learning rate.
    momentum : SGD momentum (ignored by AdamW).
    weight_decay : weight decay (``0`` = none).
    batch_size : rows per step; ``None`` = the whole training set (full-batch).
    epochs, max_steps : budget; training stops at whichever comes first (at least one must be set).
    schedule : ``"constant"`` or ``"warmup_cosine"`` (linear warm-up over ``warmup`` of the planned
        steps, then cosine decay to 0; the planned steps are ``epochs`` x steps per epoch, capped by
        ``max_steps``).
    clip : maximal global gradient norm (``0`` = no clipping).
    loss_tol : stop after an epoch whose mean training loss (nats) is below it (``0`` = never).
    drop_last : skip the last, shorter batch of an epoch.
    order : how each epoch's permutation is drawn from ``seed``: ``"numpy"``
        (``np.random.default_rng(seed)``) or ``"torch"`` (``torch.Generator().manual_seed(seed)``).
    frozen : parameter-name prefixes that are not trained (e.g. ``("head",)``).
    stop_steps : stop after this many optimizer steps *without* changing the planned schedule (a
        truncated run, e.g. to tune a learning rate on the first part of the real schedule);
        ``None`` = run the whole budget.
    """

    optimizer: Literal["sgd", "adamw"] = "sgd"
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 0.0
    batch_size: int | None = 128
    epochs: int | None = None
    max_steps: int | None = None
    schedule: Literal["constant", "warmup_cosine"] = "constant"
    warmup: float = 0.05
    clip: float = 0.0
    loss_tol: float = 0.0
    drop_last: bool = False
    order: Literal["numpy", "torch"] = "numpy"
    frozen: tuple[str, ...] = ()
    stop_steps: int | None = None

    def __post_init__(self) -> None:
        check_choice("optimizer", self.optimizer, ("sgd", "adamw"))
        check_positive("lr", self.lr)
        check_nonnegative("momentum", self.momentum)
        check_nonnegative("weight_decay", self.weight_decay)
        if self.batch_size is not None:
            check_int("batch_size", self.batch_size, minimum=1)
        if self.epochs is None and self.max_steps is None:
            raise ValueError("epochs and max_steps are both None: give at least one training budget")
        if self.epochs is not None:
            check_int("epochs", self.epochs, minimum=1)
        if self.max_steps is not None:
            check_int("max_steps", self.max_steps, minimum=1)
        check_choice("schedule", self.schedule, ("constant", "warmup_cosine"))
        check_range("warmup", self.warmup, 0.0, 1.0)
        check_nonnegative("clip", self.clip)
        check_nonnegative("loss_tol", self.loss_tol)
        check_choice("order", self.order, ("numpy", "torch"))
        if self.stop_steps is not None:
            check_int("stop_steps", self.stop_steps, minimum=1)
        object.__setattr__(self, "frozen", tuple(self.frozen))


@dataclass(frozen=True)
class TrainResult:
    """converged: an epoch-mean training loss reached ``loss_tol`` (always False when ``loss_tol`` is 0);
    n_iter: optimizer steps; residual: the last epoch-mean training loss (nats; inf after divergence);
    epochs: epochs started; last_batch_loss: the loss of the final step (nats)."""

    converged: bool
    n_iter: int
    residual: float
    epochs: int
    last_batch_loss: float = math.nan


def n_rows(inputs: Inputs) -> int:
    """Number of samples in a tensor ``(n, ...)`` or a dict of row-aligned tensors."""
    if isinstance(inputs, Mapping):
        return len(next(iter(inputs.values())))
    return int(inputs.shape[0])


def take_rows(inputs: Inputs, idx: Any) -> Inputs:
    """Rows ``idx`` of a tensor or of every tensor of a dict."""
    if isinstance(inputs, Mapping):
        return {k: v[idx] for k, v in inputs.items()}
    return inputs[idx]


def _lr_at(cfg: TrainConfig, step: int, planned: int) -> float:
    if cfg.schedule == "constant":
        return cfg.lr
    warm = max(1, math.floor(planned * cfg.warmup + 1e-9))  # planned // 20 for the default 5%
    if step < warm:
        return cfg.lr * (step + 1) / warm
    return 0.5 * cfg.lr * (1 + math.cos(math.pi * (step - warm) / max(1, planned - warm)))


def _trainable(model: nn.Module, frozen: Sequence[str]) -> list[nn.Parameter]:
    """Set ``requires_grad`` by ``frozen`` (parameter names or module prefixes) and return the trainable parameters."""
    params = []
    for name, p in model.named_parameters():
        off = any(name == f or name.startswith(f + ".") for f in frozen)
        p.requires_grad_(not off)
        if not off:
            params.append(p)
    return params


def _optimizer(cfg: TrainConfig, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def _schedule(cfg: TrainConfig, n: int) -> tuple[int, int, int, int, int]:
    """``(batch size, steps per epoch, planned steps, steps run, epochs to iterate)`` for ``n`` rows."""
    bs = n if cfg.batch_size is None else min(cfg.batch_size, n)
    per_epoch = n // bs if cfg.drop_last else math.ceil(n / bs)
    planned = cfg.epochs * per_epoch if cfg.epochs is not None else math.inf
    if cfg.max_steps is not None:
        planned = min(planned, cfg.max_steps)
    n_planned = int(planned)
    n_run = n_planned if cfg.stop_steps is None else min(n_planned, cfg.stop_steps)
    budget_epochs = math.ceil(n_run / per_epoch) if cfg.epochs is None or n_run < n_planned else cfg.epochs
    return bs, per_epoch, n_planned, n_run, budget_epochs


def _step(model: nn.Module, opt: torch.optim.Optimizer, params: list[nn.Parameter], x, y: torch.Tensor,
          cls: torch.Tensor | None, loss_fn: Callable, clip: float) -> float:
    """One optimiser step on the batch ``(x, y)``; the batch loss (non-finite: no step taken)."""
    logits = model(x)
    if cls is not None:
        logits = logits[:, cls]
    value = loss_fn(logits, y)
    if not torch.isfinite(value.detach()):
        return float(value.detach())
    opt.zero_grad(set_to_none=True)
    value.backward()
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(params, clip)
    opt.step()
    return float(value.detach())


def train_(model: nn.Module, inputs: Inputs, labels: torch.Tensor, *, config: TrainConfig, seed: int = 0,
           loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
           classes: Sequence[int] | None = None, desc: str | None = None) -> TrainResult:
    """Train ``model`` in place on ``(inputs, labels)``; returns a :class:`TrainResult`.

    inputs : a tensor ``(n, ...)`` or a dict of row-aligned tensors (e.g. tokenized text); labels :
    int64 ``(n,)``. ``loss(logits, labels)`` defaults to mean cross-entropy; ``classes`` restricts the
    logits to those output indices first (labels then index ``classes``). Epoch permutations come from
    ``seed`` (see ``TrainConfig.order``); torch's global RNG (dropout) is seeded with ``seed`` inside
    and restored afterwards. ``requires_grad`` flags are restored on return; the model is left in eval
    mode. A non-finite loss stops training (``residual = inf``, ``converged = False``).
    """
    cfg = config
    n = n_rows(inputs)
    if n < 1 or int(labels.shape[0]) != n:
        raise ValueError(f"inputs have {n} rows and labels {int(labels.shape[0])}: need the same number, at least 1")
    loss_fn = loss if loss is not None else F.cross_entropy
    cls = torch.as_tensor(list(classes), dtype=torch.long) if classes is not None else None
    flags = [(p, p.requires_grad) for p in model.parameters()]
    params = _trainable(model, cfg.frozen)
    opt = _optimizer(cfg, params)
    bs, per_epoch, n_planned, n_run, budget_epochs = _schedule(cfg, n)
    np_rng = np.random.default_rng(seed) if cfg.order == "numpy" else None
    gen = torch.Generator().manual_seed(int(seed)) if cfg.order == "torch" else None
    steps, epochs, last, batch_loss = 0, 0, math.inf, math.nan
    converged = False
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            model.train()
            epoch_iter = progress(range(budget_epochs), desc=desc, total=budget_epochs) if desc else range(budget_epochs)
            for _ in epoch_iter:
                perm = torch.from_numpy(np_rng.permutation(n)) if np_rng is not None else torch.randperm(n, generator=gen)
                epochs += 1
                total, count = 0.0, 0
                for i in range(per_epoch):
                    idx = perm[i * bs:(i + 1) * bs]
                    for g in opt.param_groups:
                        g["lr"] = _lr_at(cfg, steps, n_planned)
                    value = _step(model, opt, params, take_rows(inputs, idx), labels[idx], cls, loss_fn, cfg.clip)
                    if not math.isfinite(value):
                        return TrainResult(False, steps, math.inf, epochs, value)
                    batch_loss = value
                    total += batch_loss * len(idx)
                    count += len(idx)
                    steps += 1
                    if steps >= n_run:
                        break
                last = total / max(count, 1)
                if cfg.loss_tol > 0 and last < cfg.loss_tol:
                    converged = True
                    break
                if steps >= n_run:
                    break
    finally:
        for p, r in flags:
            p.requires_grad_(r)
        model.eval()
    return TrainResult(converged, steps, float(last), epochs, batch_loss)


@torch.no_grad()
def accuracy(model: nn.Module, inputs: Inputs, labels: torch.Tensor, *, classes: Sequence[int] | None = None,
             batch_size: int = 512) -> float:
    """Top-1 accuracy (a fraction in [0, 1]) of ``model`` in eval mode on ``(inputs, labels)``.

    ``classes`` restricts the logits to those output indices (labels then index ``classes``). The
    training flag of every module is restored afterwards.
    """
    check_int("batch_size", batch_size, minimum=1)
    cls = torch.as_tensor(list(classes), dtype=torch.long) if classes is not None else None
    n = n_rows(inputs)
    if n < 1:
        raise ValueError("accuracy needs at least one sample")
    correct = 0
    with module_mode(model):
        for i in range(0, n, batch_size):
            logits = model(take_rows(inputs, slice(i, i + batch_size)))
            if cls is not None:
                logits = logits[:, cls]
            correct += int((logits.argmax(1) == labels[i:i + batch_size]).sum())
    return correct / n
