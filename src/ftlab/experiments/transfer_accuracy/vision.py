"""Image tasks for the real pretrained pairs (EfficientNet-Lite0/1/2) and the encoder builder.

The ImageNet models read 28x28 grayscale digits and clothes as RGB images at a reduced resolution
(``resolution``, default 32 px instead of the native 224-260 px, so the benchmark runs on 2 CPU
cores): bilinear up-sampling, the gray channel copied to R, G and B, ImageNet mean/std
normalisation. The models are fully convolutional, so one resolution serves all three.

Tasks (:data:`IMAGE_TASKS`; each with fixed validation and test sets, and a training draw per seed):

========================  ============================================================================
``mnist``                 MNIST digits, 10 classes
``fashion``               Fashion-MNIST, 10 classes
``digits``                scikit-learn's 8x8 digits, up-sampled into MNIST's 20x20 box (1797 images)
``fashion_tops``          Fashion-MNIST t-shirt, pullover, coat, shirt (4 confusable classes)
``mnist_noise``           MNIST with additive Gaussian noise (sigma 0.3 in [0, 1] units)
========================  ============================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ftlab.core.validate import check_choice, check_int

__all__ = ["IMAGE_TASKS", "ImageTask", "ImageTaskData", "load_efficientnet", "load_image_task", "to_imagenet_rgb"]

_MEAN = (0.485, 0.456, 0.406)
_NOISE = 0.3  # sigma of mnist_noise, in [0, 1] pixel units (0.6 leaves 25% to a 32-px linear probe)
_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ImageTask:
    """A classification task from an offline image source: ``source`` (``mnist``, ``fashion``, ``digits``),
    the source labels kept (task label ``i`` = ``classes[i]``) and a shift (``none`` or ``noise``)."""

    name: str
    source: str
    classes: tuple[int, ...]
    shift: str
    description: str


IMAGE_TASKS: dict[str, ImageTask] = {t.name: t for t in (
    ImageTask("mnist", "mnist", tuple(range(10)), "none", "MNIST digits (10 classes)"),
    ImageTask("fashion", "fashion", tuple(range(10)), "none", "Fashion-MNIST (10 classes)"),
    ImageTask("digits", "digits", tuple(range(10)), "none", "scikit-learn 8×8 digits, up-sampled (10 classes)"),
    ImageTask("fashion_tops", "fashion", (0, 2, 4, 6), "none",
              "Fashion-MNIST t-shirt / pullover / coat / shirt (4 confusable classes)"),
    ImageTask("mnist_noise", "mnist", tuple(range(10)), "noise", "MNIST with Gaussian noise σ = 0.3 (10 classes)"),
)}


@dataclass(frozen=True)
class ImageTaskData:
    """ImageNet-normalised RGB tensors ``(n, 3, r, r)`` and int64 task labels per split."""

    task: ImageTask
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor

    @property
    def n_classes(self) -> int:
        return len(self.task.classes)


def to_imagenet_rgb(images: np.ndarray, resolution: int) -> torch.Tensor:
    """``(n, H, W)`` images in [0, 1] -> ``(n, 3, r, r)`` float32, bilinear, ImageNet mean/std normalised."""
    check_int("resolution", resolution, minimum=8)
    t = torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32)).unsqueeze(1)
    if t.shape[-1] != resolution or t.shape[-2] != resolution:
        t = F.interpolate(t, size=(resolution, resolution), mode="bilinear", align_corners=False)
    t = t.clamp(0.0, 1.0).expand(-1, 3, -1, -1)
    mean = torch.tensor(_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(_STD).view(1, 3, 1, 1)
    return ((t - mean) / std).contiguous()


def load_image_task(name: str, *, n_train: int, n_val: int, n_test: int, seed: int = 0,
                    resolution: int = 32) -> ImageTaskData:
    """Splits of task ``name``: validation and test fixed, the ``n_train`` training images drawn by ``seed``.

    Validation images come from the training split (disjoint from every training draw); test images
    from the test split. ``digits`` has 1258 training images: its validation set shrinks when
    ``n_train + n_val`` exceeds that; its test split holds 539 images.
    """
    from ftlab.experiments.transfer_accuracy.tasks import _raw

    check_choice("task", name, list(IMAGE_TASKS))
    for k, v in (("n_train", n_train), ("n_val", n_val), ("n_test", n_test)):
        check_int(k, v, 1)
    task = IMAGE_TASKS[name]
    keep = np.asarray(task.classes)

    def select(split: str):
        imgs, labels = _raw(task.source, split)
        idx = np.flatnonzero(np.isin(labels, keep))
        return imgs[idx], np.searchsorted(keep, labels[idx]).astype(np.int64)

    tr_imgs, tr_y = select("train")
    order = np.random.default_rng(12345).permutation(len(tr_y))
    if n_train >= len(order):
        raise ValueError(f"n_train={n_train} is out of range: task {name!r} has {len(order)} training images")
    n_val = min(n_val, len(order) - n_train)
    val_idx, pool = order[:n_val], order[n_val:]
    train_idx = np.random.default_rng(seed).choice(pool, size=n_train, replace=False)
    te_imgs, te_y = select("test")
    te_idx = np.random.default_rng(12345).permutation(len(te_y))[:min(n_test, len(te_y))]

    def prep(imgs: np.ndarray, noise_seed: int) -> torch.Tensor:
        x = imgs.astype(np.float32) / 255.0
        if task.shift == "noise":
            noise = np.random.default_rng(noise_seed).normal(0.0, _NOISE, size=x.shape).astype(np.float32)
            x = np.clip(x + noise, 0, 1)
        return to_imagenet_rgb(x, resolution)

    t = torch.from_numpy
    return ImageTaskData(task, prep(tr_imgs[train_idx], 10_000 + seed), t(tr_y[train_idx]), prep(tr_imgs[val_idx], 777),
                         t(tr_y[val_idx]), prep(te_imgs[te_idx], 778), t(te_y[te_idx]))


def load_efficientnet(variant: str):
    """EfficientNet-``variant`` with its ImageNet weights (loaded strictly), without the ImageNet classifier,
    in eval mode: an encoder whose ``features`` are the pooled 1280-d head features."""
    from ftlab.data.weights import load_efficientnet_lite_state
    from ftlab.models.efficientnet import EfficientNetLite

    model = EfficientNetLite(variant, num_classes=1000)
    model.load_state_dict(load_efficientnet_lite_state(variant), strict=True)
    model._fc = None
    return model.eval()
