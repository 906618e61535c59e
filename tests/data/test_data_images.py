"""Offline image loaders: IDX parsing on tiny files in the real format, and missing-data errors."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from ftlab.data import DatasetMissing, load_digits, load_fashion_mnist, read_idx


def _write_idx(path, arr: np.ndarray, code: int = 0x08, compress: bool = True):
    header = bytes([0, 0, code, arr.ndim]) + b"".join(struct.pack(">I", s) for s in arr.shape)
    data = header + arr.astype(arr.dtype.newbyteorder(">")).tobytes()
    if compress:
        with gzip.open(path, "wb") as fh:
            fh.write(data)
    else:
        path.write_bytes(data)


def test_read_idx_roundtrip(tmp_path):
    imgs = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    _write_idx(tmp_path / "a-idx3-ubyte.gz", imgs)
    assert np.array_equal(read_idx(tmp_path / "a-idx3-ubyte.gz"), imgs)
    f32 = np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2)
    _write_idx(tmp_path / "b-idx", f32, code=0x0D, compress=False)
    out = read_idx(tmp_path / "b-idx")
    assert out.dtype == np.float32 and np.array_equal(out, f32)


def test_read_idx_rejects_truncated_and_bad_header(tmp_path):
    imgs = np.zeros((2, 3, 3), dtype=np.uint8)
    _write_idx(tmp_path / "t.idx", imgs, compress=False)
    raw = (tmp_path / "t.idx").read_bytes()
    (tmp_path / "t.idx").write_bytes(raw[:-1])
    with pytest.raises(ValueError, match="holds 17 bytes of data, expected 18"):
        read_idx(tmp_path / "t.idx")
    (tmp_path / "h.idx").write_bytes(b"\x01\x02\x08\x01")
    with pytest.raises(ValueError, match="invalid header"):
        read_idx(tmp_path / "h.idx")


def test_fashion_mnist_from_root_and_missing(tmp_path):
    imgs = np.random.default_rng(0).integers(0, 256, size=(5, 28, 28), dtype=np.uint8)
    labels = np.array([0, 1, 2, 3, 9], dtype=np.uint8)
    _write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", imgs)
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", labels)
    x, y = load_fashion_mnist("test", root=tmp_path)
    assert np.array_equal(x, imgs) and y.dtype == np.int64 and y.tolist() == [0, 1, 2, 3, 9]
    with pytest.raises(DatasetMissing, match="dataset-fashion-mnist"):
        load_fashion_mnist("test", root=tmp_path / "nowhere")
    with pytest.raises(ValueError, match="split='val'"):
        load_fashion_mnist("val", root=tmp_path)


def test_digits_split_is_a_partition():
    pytest.importorskip("sklearn")
    xtr, ytr = load_digits("train", seed=3)
    xte, yte = load_digits("test", seed=3)
    assert len(ytr) + len(yte) == 1797 and xtr.dtype == np.uint8 and xtr.max() == 255
    # together the two splits are exactly the full dataset (a permutation, no repeats, none lost)
    from sklearn.datasets import load_digits as sk

    full = sk().target
    assert sorted(np.concatenate([ytr, yte]).tolist()) == sorted(full.tolist())
    xtr2, _ = load_digits("train", seed=4)
    assert not np.array_equal(xtr, xtr2)  # the seed changes the split
