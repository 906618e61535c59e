"""Loaders for the standard CIFAR-10, CIFAR-100 and SVHN files, when a user has downloaded them.

None of these datasets installs offline (see docs/data.md); these readers make the paper-scale run
one flag away. Nothing is downloaded. Every loader returns ``(images, labels)`` with ``images`` a
``uint8`` array of shape ``(n, 3, 32, 32)`` (channels first, ready for ``torch``) and ``labels``
``int64`` of shape ``(n,)``.

Formats read:

* CIFAR "python version" (``cifar-10-batches-py/{data_batch_1..5,test_batch}``,
  ``cifar-100-python/{train,test}``): pickled dicts, read with a **restricted unpickler** that
  resolves only the few globals these files need (numpy's array reconstructor, ``ndarray``,
  ``dtype`` and ``_codecs.encode``); any other global -- e.g. ``os.system`` in a tampered file --
  raises ``ValueError`` instead of running.
* CIFAR "binary version" (``cifar-10-batches-bin/*.bin``: 1 label byte + 3072 pixel bytes per
  record; ``cifar-100-binary/{train,test}.bin``: coarse label, fine label, 3072 pixel bytes).
* SVHN cropped digits (``train_32x32.mat``, ``test_32x32.mat``, ``extra_32x32.mat``) via
  ``scipy.io.loadmat``: ``X`` of shape ``(32, 32, 3, n)``, ``y`` with 10 standing for digit 0
  (mapped to 0 here).

Folders: ``root=`` argument, else ``$FTLAB_DATA/<name>``; get the files from
https://www.cs.toronto.edu/~kriz/cifar.html and http://ufldl.stanford.edu/housenumbers/.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Literal

import numpy as np

from ftlab.core.validate import check_choice
from ftlab.data.images import DatasetMissing

LabelKind = Literal["fine", "coarse"]
SvhnSplit = Literal["train", "test", "extra"]
Split = Literal["train", "test"]

__all__ = ["load_cifar10", "load_cifar100", "load_svhn", "read_cifar_pickle", "read_cifar_binary"]

_N_PIX = 3 * 32 * 32


def _np_reconstruct():
    import importlib

    try:
        return importlib.import_module("numpy._core.multiarray")._reconstruct
    except ImportError:  # numpy < 2
        return importlib.import_module("numpy.core.multiarray")._reconstruct


def _allowed(module: str, name: str):
    import _codecs

    table = {
        ("numpy.core.multiarray", "_reconstruct"): _np_reconstruct,
        ("numpy._core.multiarray", "_reconstruct"): _np_reconstruct,
        ("numpy", "ndarray"): lambda: np.ndarray,
        ("numpy", "dtype"): lambda: np.dtype,
        ("_codecs", "encode"): lambda: _codecs.encode,
    }
    factory = table.get((module, name))
    return None if factory is None else factory()


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        obj = _allowed(module, name)
        if obj is None:
            raise ValueError(f"refusing to unpickle global {module}.{name}: not part of the CIFAR file format")
        return obj


def read_cifar_pickle(path: str | os.PathLike) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Read one CIFAR python-version batch: ``(images (n, 3, 32, 32) uint8, {label key: int64 (n,)})``.

    Label keys: ``labels`` (CIFAR-10), ``fine_labels`` and ``coarse_labels`` (CIFAR-100).
    """
    path = Path(path)
    with open(path, "rb") as fh:
        try:
            obj = _RestrictedUnpickler(io.BytesIO(fh.read()), encoding="bytes").load()
        except (pickle.UnpicklingError, EOFError) as exc:
            raise ValueError(f"{path} is not a readable CIFAR pickle: {exc}") from exc
    if not isinstance(obj, dict):
        raise ValueError(f"{path} does not hold a dict: not a CIFAR batch")
    obj = {(k.decode() if isinstance(k, bytes) else k): v for k, v in obj.items()}
    if "data" not in obj:
        raise ValueError(f"{path} has no 'data' entry: not a CIFAR batch")
    data = np.asarray(obj["data"], dtype=np.uint8)
    if data.ndim != 2 or data.shape[1] != _N_PIX:
        raise ValueError(f"{path}: data has shape {data.shape}, expected (n, {_N_PIX})")
    labels = {k: np.asarray(obj[k], dtype=np.int64) for k in ("labels", "fine_labels", "coarse_labels") if k in obj}
    if not labels:
        raise ValueError(f"{path} has no labels / fine_labels entry: not a CIFAR batch")
    for k, v in labels.items():
        if v.shape != (data.shape[0],):
            raise ValueError(f"{path}: {k} has shape {v.shape}, expected ({data.shape[0]},)")
    return data.reshape(-1, 3, 32, 32), labels


def read_cifar_binary(path: str | os.PathLike, *, label_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """Read a CIFAR binary-version file: ``label_bytes`` = 1 (CIFAR-10) or 2 (CIFAR-100: coarse, fine).

    Returns ``(images (n, 3, 32, 32) uint8, labels (n, label_bytes) int64)``.
    """
    check_choice("label_bytes", label_bytes, (1, 2))
    raw = np.fromfile(Path(path), dtype=np.uint8)
    rec = label_bytes + _N_PIX
    if raw.size == 0 or raw.size % rec:
        raise ValueError(f"{path} has {raw.size} bytes: not a whole number of {rec}-byte CIFAR records")
    raw = raw.reshape(-1, rec)
    return raw[:, label_bytes:].reshape(-1, 3, 32, 32).copy(), raw[:, :label_bytes].astype(np.int64)


def _root(name: str, root, marker_sets: list[list[str]]) -> Path:
    cands = [Path(root)] if root is not None else []
    if root is None and os.environ.get("FTLAB_DATA"):
        base = Path(os.environ["FTLAB_DATA"])
        cands += [base / name, base]
    for c in cands:
        for markers in marker_sets:
            if all((c / m).exists() for m in markers):
                return c
    where = ", ".join(map(str, cands)) or "nowhere (pass root= or set FTLAB_DATA)"
    raise DatasetMissing(f"{name} not found (looked in {where}): download the standard files (see ftlab.data.cifar_svhn)")


def load_cifar10(split: Split = "train", *, root: str | os.PathLike | None = None):
    """CIFAR-10 (Krizhevsky 2009): 50k train / 10k test, 10 classes; python or binary version."""
    check_choice("split", split, ("train", "test"))
    py = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
    bins = [f"data_batch_{i}.bin" for i in range(1, 6)] if split == "train" else ["test_batch.bin"]
    base = _root("cifar-10", root, [py, bins, [f"cifar-10-batches-py/{f}" for f in py],
                                    [f"cifar-10-batches-bin/{f}" for f in bins]])
    for sub in ("", "cifar-10-batches-py", "cifar-10-batches-bin"):
        d = base / sub
        if all((d / f).exists() for f in py):
            parts = [read_cifar_pickle(d / f) for f in py]
            return np.concatenate([p[0] for p in parts]), np.concatenate([p[1]["labels"] for p in parts])
        if all((d / f).exists() for f in bins):
            binary = [read_cifar_binary(d / f, label_bytes=1) for f in bins]
            return np.concatenate([p[0] for p in binary]), np.concatenate([p[1][:, 0] for p in binary])
    raise DatasetMissing(f"cifar-10 {split} files incomplete under {base}")


def load_cifar100(split: Split = "train", *, root: str | os.PathLike | None = None, label: LabelKind = "fine"):
    """CIFAR-100: 50k train / 10k test; ``label="fine"`` (100 classes) or ``"coarse"`` (20)."""
    check_choice("split", split, ("train", "test"))
    check_choice("label", label, ("fine", "coarse"))
    base = _root("cifar-100", root, [[split], [f"{split}.bin"], [f"cifar-100-python/{split}"],
                                     [f"cifar-100-binary/{split}.bin"]])
    for sub in ("", "cifar-100-python", "cifar-100-binary"):
        d = base / sub
        if (d / split).is_file():
            imgs, labels = read_cifar_pickle(d / split)
            return imgs, labels[f"{label}_labels"]
        if (d / f"{split}.bin").is_file():
            imgs, lab = read_cifar_binary(d / f"{split}.bin", label_bytes=2)
            return imgs, lab[:, 0 if label == "coarse" else 1]
    raise DatasetMissing(f"cifar-100 {split} file missing under {base}")


def load_svhn(split: SvhnSplit = "train", *, root: str | os.PathLike | None = None):
    """SVHN cropped digits (Netzer et al. 2011): ``train`` 73,257 / ``test`` 26,032 / ``extra``."""
    from scipy.io import loadmat

    check_choice("split", split, ("train", "test", "extra"))
    fname = f"{split}_32x32.mat"
    base = _root("svhn", root, [[fname]])
    mat = loadmat(str(base / fname))
    if "X" not in mat or "y" not in mat:
        raise ValueError(f"{base / fname} lacks the 'X' and 'y' arrays of the SVHN format")
    X, y = np.asarray(mat["X"]), np.asarray(mat["y"]).reshape(-1).astype(np.int64)
    if X.ndim != 4 or X.shape[:3] != (32, 32, 3) or X.shape[3] != y.size:
        raise ValueError(f"{base / fname}: X has shape {X.shape}, expected (32, 32, 3, {y.size})")
    y[y == 10] = 0
    return np.ascontiguousarray(X.transpose(3, 2, 0, 1)).astype(np.uint8), y
