"""Image data of the vision experiments: cached uint8 arrays, seeded class splits, the three tasks.

Pretraining uses the Fashion-MNIST classes that are not held out (8 of 10, permuted per seed, as
Lippl & Lindsey 2024, arXiv 2310.02396, permute CIFAR-100's classes). Fine-tuning tasks (:data:`FT_TASKS`):

* ``pt_subset`` -- 2 of the pretraining classes (the paper's class-subset task);
* ``heldout`` -- the 2 Fashion-MNIST classes held out of pretraining;
* ``mnist`` -- the 10 MNIST digits, another dataset (ftlab's offline stand-in for SVHN).

Images stay ``uint8`` in memory (one copy per process) and become float32 tensors ``(n, 1, H, W)``
in [-1, 1] (``(x / 255 - 0.5) / 0.5``), optionally average-pooled by ``downsample`` (2: 28x28 ->
14x14), only for the rows a run uses.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch.nn import functional as F

from ftlab.core.validate import check_choice, check_int
from ftlab.data.images import Split

__all__ = ["FT_TASKS", "N_CLASSES", "N_PT_CLASSES", "balanced_subset", "class_split", "load_split", "pt_pool",
           "task_pool", "to_tensor"]

FT_TASKS = ("pt_subset", "heldout", "mnist")
N_CLASSES = 10  # Fashion-MNIST and MNIST
N_HELDOUT = 2
N_PT_CLASSES = N_CLASSES - N_HELDOUT
N_SUBSET = 2


@functools.lru_cache(maxsize=4)
def load_split(dataset: str, split: Split) -> tuple[np.ndarray, np.ndarray]:
    """``(uint8 images (n, 28, 28), int64 labels)`` of ``fashion_mnist`` or ``mnist`` (cached)."""
    from ftlab.data import load_fashion_mnist, load_mnist

    check_choice("dataset", dataset, ("fashion_mnist", "mnist"))
    return (load_fashion_mnist if dataset == "fashion_mnist" else load_mnist)(split)


def to_tensor(images: np.ndarray, downsample: int = 1) -> torch.Tensor:
    """uint8 ``(n, H, W)`` -> float32 ``(n, 1, H / downsample, W / downsample)`` in [-1, 1]."""
    x = torch.from_numpy(np.ascontiguousarray(images)).float().div_(255.0).sub_(0.5).div_(0.5).unsqueeze(1)
    return F.avg_pool2d(x, downsample) if downsample > 1 else x


def class_split(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(pretraining classes, held-out classes, the pt_subset classes)`` of Fashion-MNIST for a seed."""
    perm = np.random.default_rng([int(seed), 7919]).permutation(N_CLASSES)
    pt = np.sort(perm[N_HELDOUT:])
    sub = np.sort(np.random.default_rng([int(seed), 7920]).choice(pt, N_SUBSET, replace=False))
    return pt, np.sort(perm[:N_HELDOUT]), sub


def balanced_subset(labels: np.ndarray, n: int, *, seed) -> np.ndarray:
    """Indices of ``n`` rows, as class-balanced as possible (``n // k`` per class, the remainder from
    random classes), drawn with ``numpy.random.default_rng(seed)``."""
    check_int("n", n, minimum=1)
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    per = {c: rng.permutation(np.flatnonzero(labels == c)) for c in classes}
    k = len(classes)
    counts = {c: n // k for c in classes}
    for c in rng.choice(classes, size=n % k, replace=False):
        counts[c] += 1
    for c in classes:
        if counts[c] > len(per[c]):
            raise ValueError(f"n={n} is out of range: class {c} has only {len(per[c])} rows")
    idx = np.concatenate([per[c][: counts[c]] for c in classes])
    return rng.permutation(idx)


def _remap(x: np.ndarray, y: np.ndarray, classes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    keep = np.isin(y, classes)
    lut = np.full(N_CLASSES, -1, dtype=np.int64)
    lut[classes] = np.arange(len(classes))
    return x[keep], lut[y[keep]]


def pt_pool(split: Split, seed: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Fashion-MNIST images of the pretraining classes, labels remapped to ``0..k-1``, and ``k``."""
    x, y = load_split("fashion_mnist", split)
    pt, _, _ = class_split(seed)
    xs, ys = _remap(x, y, pt)
    return xs, ys, len(pt)


def task_pool(task: str, split: Split, seed: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Images, labels (remapped to ``0..k-1``) and ``k`` of a fine-tuning task (see :data:`FT_TASKS`)."""
    check_choice("task", task, FT_TASKS)
    if task == "mnist":
        x, y = load_split("mnist", split)
        return x, y, N_CLASSES
    x, y = load_split("fashion_mnist", split)
    _, held, sub = class_split(seed)
    xs, ys = _remap(x, y, held if task == "heldout" else sub)
    return xs, ys, N_HELDOUT if task == "heldout" else N_SUBSET
