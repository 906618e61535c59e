"""Image data for the deep experiments: cached uint8 arrays, seeded class splits and subsets.

Images are kept as ``uint8`` (one copy per process) and converted to float32 tensors
``(n, 1, 28, 28)`` scaled to [-1, 1] (``(x / 255 - 0.5) / 0.5``, the normalization of Lippl &
Lindsey 2024) only for the rows a run uses.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from ftlab.core.validate import check_choice, check_int
from ftlab.data.images import Split

__all__ = ["FT_TASKS", "load_split", "to_tensor", "class_split", "balanced_subset", "task_pool"]

FT_TASKS = ("fmnist_heldout", "mnist")


@functools.lru_cache(maxsize=4)
def load_split(dataset: str, split: Split) -> tuple[np.ndarray, np.ndarray]:
    """``(uint8 images (n, 28, 28), int64 labels)`` of ``fashion_mnist`` or ``mnist`` (cached)."""
    from ftlab.data import load_fashion_mnist, load_mnist

    check_choice("dataset", dataset, ("fashion_mnist", "mnist"))
    return (load_fashion_mnist if dataset == "fashion_mnist" else load_mnist)(split)


def to_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 ``(n, H, W)`` -> float32 ``(n, 1, H, W)`` in [-1, 1]."""
    x = torch.from_numpy(np.ascontiguousarray(images)).float().div_(255.0).sub_(0.5).div_(0.5)
    return x.unsqueeze(1)


def class_split(seed: int, n_pt_classes: int, n_classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Random split of the class ids (permuted per seed, as Lippl & Lindsey do for CIFAR-100):
    ``(pretraining classes, held-out classes)``."""
    check_int("n_pt_classes", n_pt_classes, minimum=1)
    if n_pt_classes >= n_classes:
        raise ValueError(f"n_pt_classes={n_pt_classes} is out of range: must be < {n_classes} to hold classes out")
    perm = np.random.default_rng([int(seed), 7919]).permutation(n_classes)
    return np.sort(perm[:n_pt_classes]), np.sort(perm[n_pt_classes:])


def balanced_subset(labels: np.ndarray, n: int, *, seed) -> np.ndarray:
    """Indices of ``n`` rows, as class-balanced as possible (``n // k`` per class, the remainder from
    random classes), drawn with ``numpy.random.default_rng(seed)``."""
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


def task_pool(task: str, split: str, seed: int, n_pt_classes: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Images, labels (remapped to ``0..k-1``) and ``k`` of a fine-tuning task:
    ``fmnist_heldout`` (the Fashion-MNIST classes held out of pretraining) or ``mnist`` (10 digits,
    ftlab's offline stand-in for SVHN)."""
    check_choice("task", task, FT_TASKS)
    if task == "mnist":
        x, y = load_split("mnist", split)
        return x, y, 10
    x, y = load_split("fashion_mnist", split)
    _, held = class_split(seed, n_pt_classes)
    keep = np.isin(y, held)
    remap = {int(c): i for i, c in enumerate(held)}
    return x[keep], np.array([remap[int(v)] for v in y[keep]], dtype=np.int64), len(held)
