"""CIFAR / SVHN readers on tiny files written in the standard formats."""

import os
import pickle

import numpy as np
import pytest
import scipy.io

from ftlab.data.cifar_svhn import (
    DatasetMissing,
    load_cifar10,
    load_cifar100,
    load_svhn,
    read_cifar_binary,
    read_cifar_pickle,
)


def _images(n, seed):
    return np.random.default_rng(seed).integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)


def _write_pickle(path, imgs, **labels):
    # the layout of the python-version batches: bytes keys, flat (n, 3072) uint8 rows, label lists
    d = {b"batch_label": b"tiny batch", b"data": imgs.reshape(len(imgs), -1), b"filenames": [b"a.png"] * len(imgs)}
    d.update({k.encode(): list(map(int, v)) for k, v in labels.items()})
    path.write_bytes(pickle.dumps(d, protocol=2))


def test_cifar10_python_version_roundtrip(tmp_path):
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    parts = [(_images(3, i), np.arange(3) + i) for i in range(6)]
    for i, (im, lab) in enumerate(parts[:5], start=1):
        _write_pickle(root / f"data_batch_{i}", im, labels=lab)
    _write_pickle(root / "test_batch", *parts[5][:1], labels=parts[5][1])
    X, y = load_cifar10("train", root=tmp_path)
    assert X.shape == (15, 3, 32, 32) and X.dtype == np.uint8
    np.testing.assert_array_equal(X, np.concatenate([p[0] for p in parts[:5]]))
    np.testing.assert_array_equal(y, np.concatenate([p[1] for p in parts[:5]]))
    Xt, yt = load_cifar10("test", root=tmp_path)
    np.testing.assert_array_equal(Xt, parts[5][0])


def test_cifar100_python_and_binary_agree(tmp_path):
    imgs, fine, coarse = _images(4, 9), np.array([5, 99, 0, 42]), np.array([1, 19, 0, 7])
    (tmp_path / "py").mkdir()
    _write_pickle(tmp_path / "py" / "test", imgs, fine_labels=fine, coarse_labels=coarse)
    rec = np.concatenate([coarse[:, None], fine[:, None], imgs.reshape(4, -1)], axis=1).astype(np.uint8)
    (tmp_path / "bin").mkdir()
    rec.tofile(tmp_path / "bin" / "test.bin")
    for sub in ("py", "bin"):
        X, y = load_cifar100("test", root=tmp_path / sub)
        np.testing.assert_array_equal(X, imgs)
        np.testing.assert_array_equal(y, fine)
        np.testing.assert_array_equal(load_cifar100("test", root=tmp_path / sub, label="coarse")[1], coarse)


def test_cifar10_binary_records(tmp_path):
    imgs, lab = _images(5, 3), np.array([0, 9, 3, 3, 1])
    np.concatenate([lab[:, None], imgs.reshape(5, -1)], axis=1).astype(np.uint8).tofile(tmp_path / "x.bin")
    X, L = read_cifar_binary(tmp_path / "x.bin", label_bytes=1)
    np.testing.assert_array_equal(X, imgs)
    np.testing.assert_array_equal(L[:, 0], lab)
    (tmp_path / "bad.bin").write_bytes(b"\x00" * 100)
    with pytest.raises(ValueError, match="records"):
        read_cifar_binary(tmp_path / "bad.bin", label_bytes=1)


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_restricted_unpickler_refuses_foreign_globals(tmp_path):
    p = tmp_path / "data_batch_1"
    p.write_bytes(pickle.dumps({b"data": _Evil(), b"labels": [0]}, protocol=2))
    with pytest.raises(ValueError, match="refusing to unpickle"):
        read_cifar_pickle(p)


def test_svhn_mat_maps_label_10_to_zero(tmp_path):
    imgs = _images(4, 5)
    y = np.array([[10], [1], [9], [10]], dtype=np.uint8)
    scipy.io.savemat(tmp_path / "test_32x32.mat", {"X": imgs.transpose(2, 3, 1, 0), "y": y})
    X, lab = load_svhn("test", root=tmp_path)
    np.testing.assert_array_equal(X, imgs)
    np.testing.assert_array_equal(lab, [0, 1, 9, 0])


def test_missing_files_name_the_dataset(tmp_path, monkeypatch):
    monkeypatch.delenv("FTLAB_DATA", raising=False)
    with pytest.raises(DatasetMissing, match="svhn"):
        load_svhn("train", root=tmp_path)
    with pytest.raises(DatasetMissing, match="cifar-10"):
        load_cifar10("train", root=tmp_path)
