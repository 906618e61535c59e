"""Shared fixtures: tiny Fashion-MNIST / MNIST stand-ins in the real IDX format.

End-to-end tests (deep experiments, the transfer benchmark's base-model cache) must run in CI,
where the real datasets are not installed: they read these
files through the real loaders (``$FTLAB_DATA/<name>``), so the whole path from IDX bytes to a
fine-tuned network is exercised. Each class is a distinct bright bar, so the data are learnable.

``deep_tables``: planted per-seed tables of the deep study (both parts, every column the verdicts, figures
and report read), for tests of what is written from them without training.

``faults``: the fault injector of the whole-or-nothing output tests (every ``os`` file operation of a
write path counted, and the k-th failed as a full disk or as a kill).
"""

from __future__ import annotations

import errno
import gzip
import math
import os
import struct
import types

import numpy as np
import pandas as pd
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


#: The ``os`` file operations a write path goes through (each can fail or be where a kill lands).
FAULT_OPS = ("open", "replace", "rename", "unlink", "rmdir", "mkdir", "fsync", "chmod", "fdopen", "ftruncate", "pwrite")


class Killed(BaseException):
    """Stands for SIGKILL inside the test process: from the operation it hits on, nothing reaches the disk."""


class FaultInjector:
    """Wrap the ``os`` file operations: count them, and fail the k-th (``mode="error"``), every one from
    the k-th on (``mode="kill"``, except the lock file's removal and release, which the kernel does for a
    killed process), or every write of data from the k-th on (``mode="full"``: a disk with no byte left,
    where names can still be created, renamed and removed but nothing can be written into a file).
    ``log`` lists ``(operation, paths)`` in order."""

    def __init__(self, monkeypatch, k: int | None, mode: str):
        self.k, self.mode, self.n, self.log = k, mode, 0, []
        for name in FAULT_OPS:
            monkeypatch.setattr(os, name, self._wrap(name, getattr(os, name)))

    def _fails(self, name: str, args: tuple, kw: dict) -> bool:
        if self.k is None or self.n < self.k:
            return False
        if self.mode == "full":  # data is written by pwrite and through files opened for writing
            mode = str(args[1] if len(args) > 1 else kw.get("mode", "r"))
            return name == "pwrite" or (name == "fdopen" and any(c in mode for c in "wa+"))
        return self.n == self.k or self.mode == "kill"

    def _wrap(self, name, real):
        def op(*args, **kw):
            if name == "unlink" and str(args[0]).endswith(".ftlab.lock"):
                return real(*args, **kw)
            self.n += 1
            self.log.append((name, " -> ".join(map(str, args[:2]))))
            if self._fails(name, args, kw):
                if self.mode == "kill":
                    raise Killed(f"killed at {name}")
                raise OSError(errno.ENOSPC, "No space left on device", str(args[0]) if args else None)
            return real(*args, **kw)
        return op


@pytest.fixture
def faults():
    """``faults.Injector(monkeypatch, k, mode)``, ``faults.Killed`` and ``faults.OPS`` (see :class:`FaultInjector`)."""
    return types.SimpleNamespace(Injector=FaultInjector, Killed=Killed, OPS=FAULT_OPS)


def _deep_tables(shift: float = 0.0, seeds=(0, 1, 2, 3)) -> tuple[dict, dict]:
    """``(vision, modular)`` tables ``{"ft": ..., "pt": ...}``: every arm of a small grid, accuracies around 0.7
    (vision) and 0.5 (Transformer) plus ``shift`` and seeded noise, every run inside the premise."""
    rng = np.random.default_rng(round(1000 * shift))
    vft, vpt, mft, mpt = [], [], [], []
    for arch in ("resnet18", "nf_resnet18"):
        for s in seeds:
            for knob, v in (("none", 1.0), ("kappa", 0.25), ("s", 0.25)):
                vpt.append(dict(arch=arch, seed=s, knob=knob, value=v, lr=0.05, pt_retries=0, pt_loss=0.005,
                                pt_converged=True))
            for n in (30, 100):
                for knob, when, v in (("none", "-", 1.0), ("kappa", "init", 0.25), ("kappa", "post", 0.25),
                                      ("s", "init", 0.25), ("gamma", "ft", 0.1)):
                    vft.append(dict(arch=arch, seed=s, task="mnist", n_ft=n, knob=knob, when=when, value=v, lr=0.01,
                                    ft_retries=0, acc=0.7 + shift + 0.01 * rng.standard_normal(), ft_loss=0.005,
                                    ft_converged=True))
    for s in seeds:
        for b in (math.nan, -0.5, 0.0, 0.5):
            mpt.append(dict(seed=s, b_init=b, lr=3e-3, pt_retries=0, pt_loss=0.001, pt_converged=True))
        for p, kind in ((3, "reuse"), (7, "new")):
            for when in ("init", "post"):
                for b in (-0.5, 0.0, 0.5):
                    mft.append(dict(seed=s, p=p, kind=kind, when=when, b=b, lr=1e-3, ft_retries=0,
                                    acc=0.5 + shift + 0.01 * rng.standard_normal(), ft_loss=0.001, ft_converged=True))
    return {"ft": pd.DataFrame(vft), "pt": pd.DataFrame(vpt)}, {"ft": pd.DataFrame(mft), "pt": pd.DataFrame(mpt)}


@pytest.fixture
def deep_tables():
    """``deep_tables(shift=0.0, seeds=(0, 1, 2, 3)) -> (vision, modular)``: see :func:`_deep_tables`."""
    return _deep_tables
