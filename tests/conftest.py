"""Shared fixtures: tiny Fashion-MNIST / MNIST stand-ins in the real IDX format.

End-to-end tests (deep experiments, the transfer benchmark's base-model cache) must run in CI,
where the real datasets are not installed: they read these
files through the real loaders (``$FTLAB_DATA/<name>``), so the whole path from IDX bytes to a
fine-tuned network is exercised. Each class is a distinct bright bar, so the data are learnable.
"""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest


def _write_idx(path, arr: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(struct.pack(">I", s) for s in arr.shape)
    with gzip.open(path, "wb") as fh:
        fh.write(header + arr.astype(np.uint8).tobytes())


def _images(n_per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(10), n_per_class)
    x = rng.integers(0, 60, size=(len(labels), 28, 28))
    for i, c in enumerate(labels):
        x[i, 2 + 2 * c: 4 + 2 * c, 4:24] = 230  # class c: a bar at rows 2c+2..2c+3
    perm = rng.permutation(len(labels))
    return x[perm].astype(np.uint8), labels[perm].astype(np.uint8)


@pytest.fixture
def tiny_images(tmp_path_factory, monkeypatch):
    """Point the image loaders at tiny IDX files (40 train / 15 test images per class)."""
    from ftlab.experiments.deep_claims.data import load_split
    from ftlab.experiments.transfer_accuracy.tasks import _raw

    caches = (load_split, _raw)

    root = tmp_path_factory.mktemp("ftlab_data")
    for k, name in enumerate(("fashion-mnist", "mnist")):
        d = root / name
        d.mkdir()
        for split, n, seed in (("train", 40, 2 * k), ("t10k", 15, 2 * k + 1)):
            x, y = _images(n, seed)
            _write_idx(d / f"{split}-images-idx3-ubyte.gz", x)
            _write_idx(d / f"{split}-labels-idx1-ubyte.gz", y)
    monkeypatch.setenv("FTLAB_DATA", str(root))
    for c in caches:
        c.cache_clear()
    yield root
    for c in caches:
        c.cache_clear()
