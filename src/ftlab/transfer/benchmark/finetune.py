"""Fine-tuning recipe and evaluation through a frozen head.

Both vision and text models of the benchmark are *classifiers with a frozen head*: the model's
``head`` (vision: the pretrained 20-class head; text: a linear probe fitted on the base's own
features) maps features to class logits and is never trained, as CLIP's zero-shot text head is
frozen in Ilharco et al. (2023). A task restricts the logits to its classes
(``classes``: indices into the head's outputs), so zero-shot, transferred and fine-tuned models are
all read through the same head.

Recipe (:class:`FinetuneConfig`). The default optimizer is SGD with momentum: BiCo's derivation
(spec/bico.md §2.2) writes a task vector as a sum of products ``g x^T`` of output gradients and
input activations, which holds exactly for (momentum) SGD and only approximately for Adam/AdamW,
whose per-coordinate preconditioning breaks the bilinear form. The paper's world fine-tunes with
AdamW (lr 1e-5, wd 0.1, cosine, clip 1.0; spec §5.4); ``optimizer="adamw"`` gives that recipe
here so the two can be compared. This choice is ours [U], not the paper's.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ftlab.validate import check_choice, check_int, check_nonnegative, check_positive

__all__ = ["FinetuneConfig", "finetune", "accuracy", "task_loss", "batches_of"]


@dataclass(frozen=True)
class FinetuneConfig:
    """Fine-tuning recipe (the same for the source and for the directly fine-tuned target).

    optimizer : ``"sgd"`` (momentum SGD, default: keeps the task vector bilinear) or ``"adamw"``.
    lr : peak learning rate; linear warm-up over the first 5% of steps, then cosine decay to 0.
    momentum : SGD momentum (ignored by AdamW).
    weight_decay : decoupled (AdamW) or L2 (SGD) weight decay.
    epochs, batch_size : passes over the training set and batch size.
    clip : max global gradient norm (``0`` disables clipping).
    frozen : parameter-name prefixes kept frozen (default: the head).
    """

    optimizer: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 0.0
    epochs: int = 5
    batch_size: int = 32
    clip: float = 1.0
    frozen: tuple[str, ...] = ("head",)

    def __post_init__(self):
        check_choice("optimizer", self.optimizer, ("sgd", "adamw"))
        check_positive("lr", self.lr)
        check_nonnegative("momentum", self.momentum)
        check_nonnegative("weight_decay", self.weight_decay)
        check_int("epochs", self.epochs, 1)
        check_int("batch_size", self.batch_size, 1)
        check_nonnegative("clip", self.clip)


def _index(inputs, idx):
    if isinstance(inputs, dict):
        return {k: v[idx] for k, v in inputs.items()}
    return inputs[idx]


def _length(inputs) -> int:
    if isinstance(inputs, dict):
        return len(next(iter(inputs.values())))
    return len(inputs)


def batches_of(inputs, labels, *, batch_size: int, n: int | None = None, seed: int = 0) -> list[tuple]:
    """``n`` samples (all if ``None``) drawn by ``seed`` without replacement, as ``(x, y)`` batches.

    inputs : a tensor ``(N, ...)`` or a dict of tensors (e.g. tokenized text); labels : ``(N,)``.
    """
    import torch

    total = _length(inputs)
    n = total if n is None else n
    if not 1 <= n <= total:
        raise ValueError(f"n={n} is out of range: must be in [1, {total}]")
    idx = torch.from_numpy(np.random.default_rng(seed).permutation(total)[:n])
    return [(_index(inputs, idx[i:i + batch_size]), labels[idx[i:i + batch_size]]) for i in range(0, n, batch_size)]


def task_loss(classes: Sequence[int]) -> Callable:
    """``loss(model, batch) -> scalar``: mean cross-entropy of the head's logits restricted to ``classes``."""
    import torch
    import torch.nn.functional as F

    cls = torch.as_tensor(list(classes), dtype=torch.long)

    def loss(model, batch):
        x, y = batch
        return F.cross_entropy(model(x)[:, cls], y)

    return loss


def accuracy(model, inputs, labels, classes: Sequence[int], *, batch_size: int = 512) -> float:
    """Top-1 accuracy of ``model``'s logits restricted to ``classes`` (task labels index ``classes``)."""
    import torch

    cls = torch.as_tensor(list(classes), dtype=torch.long)
    was_training = model.training
    model.eval()
    correct = 0
    n = _length(inputs)
    with torch.no_grad():
        for i in range(0, n, batch_size):
            idx = slice(i, i + batch_size)
            pred = model(_index(inputs, idx))[:, cls].argmax(1)
            correct += int((pred == labels[idx]).sum())
    model.train(was_training)
    return correct / n


def finetune(model, inputs, labels, classes: Sequence[int], *, config: FinetuneConfig = FinetuneConfig(), seed: int = 0):
    """Fine-tune a copy of ``model`` on ``(inputs, labels)`` through its frozen head; return the copy.

    inputs : tensor ``(n, ...)`` or dict of tensors; labels : int64 tensor ``(n,)`` of task labels
    (indices into ``classes``). The input model is not modified. Deterministic given ``seed``.
    """
    import torch

    torch.manual_seed(seed)
    ft = copy.deepcopy(model)
    params = []
    for name, p in ft.named_parameters():
        frozen = any(name == f or name.startswith(f + ".") for f in config.frozen)
        p.requires_grad_(not frozen)
        if not frozen:
            params.append(p)
    if config.optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
    else:
        opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    loss_fn = task_loss(classes)
    n = _length(inputs)
    steps_per_epoch = math.ceil(n / config.batch_size)
    total = config.epochs * steps_per_epoch
    warm = max(1, total // 20)
    rng = np.random.default_rng(seed)
    step = 0
    ft.train()
    for _ in range(config.epochs):
        perm = torch.from_numpy(rng.permutation(n))
        for i in range(steps_per_epoch):
            idx = perm[i * config.batch_size:(i + 1) * config.batch_size]
            lr = config.lr * (step + 1) / warm if step < warm else \
                0.5 * config.lr * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))
            for g in opt.param_groups:
                g["lr"] = lr
            loss = loss_fn(ft, (_index(inputs, idx), labels[idx]))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if config.clip > 0:
                torch.nn.utils.clip_grad_norm_(params, config.clip)
            opt.step()
            step += 1
    for p in ft.parameters():
        p.requires_grad_(True)
    return ft.eval()
