"""Pretraining data and the shifted fine-tuning tasks of the transfer benchmark.

The protocol mimics CLIP's zero-shot classification (Radford et al. 2021) at CPU scale: every base
model is pretrained on one *joint label space* of 20 classes -- Fashion-MNIST's 10 classes
(Xiao et al. 2017) as classes 0-9 and MNIST's digits (LeCun et al. 1998) as classes 10-19 -- so
each base has a zero-shot classifier for every task through the *same* head: the rows of its
``head`` for the task's classes. Fine-tuning tasks are shifted versions of those classes
(rotation, inversion, noise, another digit source, a class subset under shift). Fine-tuning
changes the encoder only; the head stays frozen, as CLIP's text head does in Ilharco et al. (2023).

Pixel sources never overlap: pretraining reads training-split indices below 40,000 (two
disjoint halves ``data="a"`` / ``data="b"``); task train/validation pools read indices 40,000 and
up; task test sets read the test split. Images are returned as float32 ``(n, 28, 28)`` scaled to
``[-1, 1]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ftlab.core.validate import check_choice, check_int
from ftlab.data import load_digits, load_fashion_mnist, load_mnist
from ftlab.data.images import Split

__all__ = ["N_JOINT_CLASSES", "Task", "TaskData", "TASKS", "pretraining_data", "load_task", "joint_test_data"]

N_JOINT_CLASSES = 20
FASHION_OFFSET = 0
MNIST_OFFSET = 10
_PRETRAIN_HALF = 20_000  # per source and per half: "a" reads [0, 20k), "b" reads [20k, 40k)
_TASK_POOL_START = 40_000


@dataclass(frozen=True)
class Task:
    """A fine-tuning task: a source dataset, a shift, and the joint classes it uses.

    source : ``"fashion"``, ``"mnist"`` or ``"digits"`` (sklearn 8x8 digits upscaled to MNIST's frame).
    shift : ``"rot90"``, ``"rot180"``, ``"invert"``, ``"noise"`` or ``"none"``.
    source_classes : labels of the source dataset kept (task label ``i`` is ``source_classes[i]``).
    description : one line for reports.
    """

    name: str
    source: str
    shift: str
    source_classes: tuple[int, ...]
    description: str

    @property
    def joint_classes(self) -> tuple[int, ...]:
        """Indices of the task's classes in the 20-class head."""
        off = FASHION_OFFSET if self.source == "fashion" else MNIST_OFFSET
        return tuple(off + c for c in self.source_classes)


TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task("mnist_rot90", "mnist", "rot90", tuple(range(10)), "MNIST digits rotated by 90 degrees"),
        Task("fashion_invert", "fashion", "invert", tuple(range(10)), "Fashion-MNIST with inverted intensities"),
        Task("mnist_noise", "mnist", "noise", tuple(range(10)),
             "MNIST with additive Gaussian noise (sigma 0.6 in [0,1] units)"),
        Task("digits", "digits", "none", tuple(range(10)),
             "sklearn 8x8 digits, upscaled into MNIST's 20x20 box (another digit source)"),
        Task("fashion_tops_rot180", "fashion", "rot180", (0, 2, 4, 6),
             "Fashion-MNIST tops (t-shirt, pullover, coat, shirt) rotated by 180 degrees (class subset under shift)"),
    )
}


@dataclass(frozen=True)
class TaskData:
    """Float32 images ``(n, 28, 28)`` in [-1, 1] and task labels in ``0..k-1`` for each split."""

    task: Task
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def _to_float(imgs: np.ndarray) -> np.ndarray:
    return (imgs.astype(np.float32) / 127.5) - 1.0


@lru_cache(maxsize=8)
def _raw(source: str, split: Split) -> tuple[np.ndarray, np.ndarray]:
    if source == "fashion":
        return load_fashion_mnist(split)
    if source == "mnist":
        return load_mnist(split)
    imgs, labels = load_digits(split)
    return _digits_to_mnist_frame(imgs), labels


def _digits_to_mnist_frame(imgs: np.ndarray) -> np.ndarray:
    """8x8 digits -> 28x28: bilinear upscaling to 20x20, centred with a 4-pixel border like MNIST."""
    import torch
    import torch.nn.functional as F

    t = torch.from_numpy(imgs.astype(np.float32)).unsqueeze(1)
    up = F.interpolate(t, size=(20, 20), mode="bilinear", align_corners=False).squeeze(1)
    out = np.zeros((imgs.shape[0], 28, 28), dtype=np.uint8)
    out[:, 4:24, 4:24] = np.clip(np.round(up.numpy()), 0, 255).astype(np.uint8)
    return out


def pretraining_data(data: str = "a", *, n_per_source: int = 10_000, seed: int = 0):
    """Joint 20-class pretraining set: ``n_per_source`` Fashion-MNIST + ``n_per_source`` MNIST images.

    data : ``"a"`` or ``"b"``, two disjoint halves of the training pools (``b`` is the
        "different pretraining data" of the pretraining setting).
    Returns ``(x, y)``: float32 ``(2 n, 28, 28)`` in [-1, 1], int64 joint labels, shuffled by ``seed``.
    """
    check_choice("data", data, ("a", "b"))
    check_int("n_per_source", n_per_source, 1)
    if n_per_source > _PRETRAIN_HALF:
        raise ValueError(f"n_per_source={n_per_source} is out of range: must be in [1, {_PRETRAIN_HALF}]")
    start = 0 if data == "a" else _PRETRAIN_HALF
    xs, ys = [], []
    for source, off in (("fashion", FASHION_OFFSET), ("mnist", MNIST_OFFSET)):
        imgs, labels = _raw(source, "train")
        sl = slice(start, start + n_per_source)
        xs.append(_to_float(imgs[sl]))
        ys.append(labels[sl] + off)
    x, y = np.concatenate(xs), np.concatenate(ys)
    perm = np.random.default_rng(seed).permutation(len(y))
    return x[perm], y[perm]


def joint_test_data(n_per_source: int = 2_000):
    """Unshifted 20-class test set (first ``n_per_source`` test images of each source)."""
    xs, ys = [], []
    for source, off in (("fashion", FASHION_OFFSET), ("mnist", MNIST_OFFSET)):
        imgs, labels = _raw(source, "test")
        xs.append(_to_float(imgs[:n_per_source]))
        ys.append(labels[:n_per_source] + off)
    return np.concatenate(xs), np.concatenate(ys)


def _apply_shift(x: np.ndarray, shift: str, rng: np.random.Generator) -> np.ndarray:
    if shift == "rot90":
        return np.ascontiguousarray(np.rot90(x, k=1, axes=(1, 2)))
    if shift == "rot180":
        return np.ascontiguousarray(np.rot90(x, k=2, axes=(1, 2)))
    if shift == "invert":
        return -x
    if shift == "noise":
        # sigma 0.6 in [0, 1] units = 1.2 in [-1, 1] units
        return np.clip(x + rng.normal(0.0, 1.2, size=x.shape).astype(np.float32), -1.0, 1.0)
    return x


def load_task(name: str, *, n_train: int, n_val: int, n_test: int, seed: int = 0) -> TaskData:
    """Shifted task data.

    n_train : training images drawn (by ``seed``) from the task's training pool; the fine-tuning
        set and the calibration sets are drawn from it.
    n_val : validation images (fixed, disjoint from every training draw) for the alpha search; fewer
        when the training pool cannot hold ``n_train + n_val`` (digits with ``n_train=1000``: 258).
    n_test : test images (fixed, from the test split; fewer when the split is smaller, e.g. digits: 539).
    seed : only changes which training images are drawn; validation and test sets, and the noise
        of the ``noise`` shift on them, are the same for every seed.
    """
    check_choice("task", name, list(TASKS))
    for k, v in (("n_train", n_train), ("n_val", n_val), ("n_test", n_test)):
        check_int(k, v, 1)
    task = TASKS[name]
    keep = np.array(task.source_classes)

    def select(split: str):
        imgs, labels = _raw(task.source, split)
        idx = np.flatnonzero(np.isin(labels, keep))
        if task.source != "digits" and split == "train":
            idx = idx[idx >= _TASK_POOL_START]
        local = np.searchsorted(keep, labels[idx]) if np.all(np.diff(keep) > 0) else None
        if local is None:  # pragma: no cover - source_classes are stored sorted
            raise ValueError(f"task {name!r}: source_classes must be increasing")
        return imgs[idx], local.astype(np.int64)

    fixed = np.random.default_rng(12345)
    tr_imgs, tr_y = select("train")
    order = fixed.permutation(len(tr_y))
    if n_train >= len(order):
        raise ValueError(f"n_train={n_train} is out of range: task {name!r} has {len(order)} training images "
                         "and needs at least one left for validation")
    n_val = min(n_val, len(order) - n_train)  # a small pool (digits: 1258) gives fewer validation images
    val_idx, pool = order[:n_val], order[n_val:]
    train_idx = np.random.default_rng(seed).choice(pool, size=n_train, replace=False)
    te_imgs, te_y = select("test")
    te_idx = fixed.permutation(len(te_y))[:min(n_test, len(te_y))]
    shift_rng = np.random.default_rng(777)
    x_val = _apply_shift(_to_float(tr_imgs[val_idx]), task.shift, shift_rng)
    x_test = _apply_shift(_to_float(te_imgs[te_idx]), task.shift, shift_rng)
    x_train = _apply_shift(_to_float(tr_imgs[train_idx]), task.shift, np.random.default_rng(10_000 + seed))
    return TaskData(task, x_train, tr_y[train_idx], x_val, tr_y[val_idx], x_test, te_y[te_idx])
