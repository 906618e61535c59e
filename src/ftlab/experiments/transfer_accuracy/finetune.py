"""The transfer benchmark's fine-tuning recipe, through a frozen head.

Both vision and text models of the benchmark are *classifiers with a frozen head*: the model's
``head`` (vision: the pretrained 20-class head; text: a linear probe fitted on the base's own
features) maps features to class logits and is never trained, as CLIP's zero-shot text head is
frozen in Ilharco et al. (2023, arXiv 2212.04089). A task restricts the logits to its classes
(``classes``: indices into the head's outputs), so zero-shot, transferred and fine-tuned models are
all read through the same head (:func:`ftlab.experiments.training.accuracy` with ``classes``).

Recipe (:func:`recipe`, a :class:`~ftlab.experiments.training.TrainConfig`). The default optimizer is
SGD with momentum: BiCo's derivation (arXiv 2605.28444, Section 3) writes a task vector as a sum of
products ``g x^T`` of output gradients and input activations, which holds exactly for (momentum) SGD
and only approximately for Adam/AdamW, whose per-coordinate preconditioning breaks the bilinear form.
``optimizer="adamw"`` is available so the two can be compared. This choice is ftlab's [U].
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ftlab.experiments.training import TrainConfig, n_rows, take_rows, train_

__all__ = ["LOSS_KINDS", "batches_of", "finetune", "recipe", "task_loss"]


def recipe(**overrides) -> TrainConfig:
    """The benchmark's fine-tuning recipe: momentum SGD (lr 0.01, momentum 0.9), 5 epochs of batches of
    32, linear warm-up over 5% of the steps then cosine decay, gradient norm clipped at 1, the ``head``
    frozen; ``overrides`` replace any field."""
    base = dict(optimizer="sgd", lr=0.01, momentum=0.9, epochs=5, batch_size=32, schedule="warmup_cosine", clip=1.0,
                frozen=("head",))
    return TrainConfig(**{**base, **overrides})


def batches_of(inputs, labels, *, batch_size: int, n: int | None = None, seed: int = 0) -> list[tuple]:
    """``n`` samples (all if ``None``) drawn by ``seed`` without replacement, as ``(x, y)`` batches.

    inputs : a tensor ``(N, ...)`` or a dict of tensors (e.g. tokenized text); labels : ``(N,)``.
    """
    total = n_rows(inputs)
    n = total if n is None else n
    if not 1 <= n <= total:
        raise ValueError(f"n={n} is out of range: must be in [1, {total}]")
    idx = torch.from_numpy(np.random.default_rng(seed).permutation(total)[:n])
    return [(take_rows(inputs, idx[i:i + batch_size]), labels[idx[i:i + batch_size]]) for i in range(0, n, batch_size)]


#: Calibration losses (:func:`task_loss` ``kind``): ``ce`` cross-entropy with the labels (the default; what
#: fine-tuning minimises); ``logit`` minus the true class's logit relative to the mean logit (no dependence on
#: the model's own errors: every sample pulls its true class with the same weight); ``pseudo`` cross-entropy
#: with the model's own prediction as the label (needs no labels).
LOSS_KINDS: tuple[str, ...] = ("ce", "logit", "pseudo")


def task_loss(classes: Sequence[int], kind: str = "ce") -> Callable:
    """``loss(model, batch) -> scalar`` through the head's logits restricted to ``classes`` (:data:`LOSS_KINDS`)."""
    from ftlab.core.validate import check_choice

    check_choice("loss", kind, LOSS_KINDS)
    cls = torch.as_tensor(list(classes), dtype=torch.long)

    def ce(model, batch):
        x, y = batch
        return F.cross_entropy(model(x)[:, cls], y)

    def logit(model, batch):
        x, y = batch
        z = model(x)[:, cls]
        return -(z.gather(1, y[:, None]).squeeze(1) - z.mean(1)).mean()

    def pseudo(model, batch):
        x, _ = batch
        z = model(x)[:, cls]
        return F.cross_entropy(z, z.detach().argmax(1))

    return {"ce": ce, "logit": logit, "pseudo": pseudo}[kind]


def finetune(model, inputs, labels, classes: Sequence[int], *, config: TrainConfig | None = None, seed: int = 0):
    """Fine-tune a copy of ``model`` on ``(inputs, labels)`` through its frozen head; return the copy (eval mode).

    inputs : tensor ``(n, ...)`` or dict of tensors; labels : int64 tensor ``(n,)`` of task labels
    (indices into ``classes``). The input model is not modified. Deterministic given ``seed``.
    """
    ft = copy.deepcopy(model)
    train_(ft, inputs, labels, config=config if config is not None else recipe(), seed=seed, classes=classes)
    return ft
