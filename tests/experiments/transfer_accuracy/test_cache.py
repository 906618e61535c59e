"""The base-model cache: deterministic rebuild, corruption and interrupted-pretraining detection."""

import json

import pytest
import torch

from ftlab.experiments.transfer_accuracy import family
from ftlab.experiments.transfer_accuracy.family import BaseSpec, cache_paths, is_cached, load_base

TINY = BaseSpec("tiny", width=8, depth=1, heads=2, n_per_source=32, epochs=1, batch_size=32)


@pytest.fixture
def counted(monkeypatch, tiny_images):
    """Count pretrainings; the images are the tiny IDX stand-ins (tests/conftest.py), so this runs in CI."""
    calls = []
    real = family.pretrain

    def wrapped(spec, **kw):
        calls.append(spec.name)
        return real(spec, **kw)

    monkeypatch.setattr(family, "pretrain", wrapped)
    return calls


def _same(a, b):
    return all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())


def test_second_load_reads_cache(tmp_path, counted):
    m1, _ = load_base(TINY, cache=tmp_path)
    m2, _ = load_base(TINY, cache=tmp_path)
    assert counted == ["tiny"] and _same(m1, m2) and is_cached(TINY, tmp_path)


def test_corrupt_weights_detected_and_rebuilt_identically(tmp_path, counted):
    m1, _ = load_base(TINY, cache=tmp_path)
    weights, _ = cache_paths(TINY, tmp_path)
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF  # flip bits inside the tensor data: still a loadable file, wrong content
    weights.write_bytes(bytes(data))
    assert not is_cached(TINY, tmp_path)
    m2, _ = load_base(TINY, cache=tmp_path)
    assert counted == ["tiny", "tiny"]
    assert _same(m1, m2)  # pretraining is deterministic given the spec
    assert is_cached(TINY, tmp_path)


def test_interrupted_pretraining_without_sidecar_is_rebuilt(tmp_path, counted):
    load_base(TINY, cache=tmp_path)
    weights, sidecar = cache_paths(TINY, tmp_path)
    sidecar.unlink()  # the sidecar is written last: its absence marks an interrupted build
    weights.write_bytes(weights.read_bytes()[:100])  # truncated checkpoint
    assert not is_cached(TINY, tmp_path)
    load_base(TINY, cache=tmp_path)
    assert counted == ["tiny", "tiny"] and is_cached(TINY, tmp_path)
    meta = json.loads(sidecar.read_text())
    assert meta["key"] == TINY.key() and 0.0 <= meta["metrics"]["joint_test_accuracy"] <= 1.0


def test_changed_spec_gets_its_own_entry():
    other = BaseSpec("tiny", width=8, depth=1, heads=2, n_per_source=32, epochs=2, batch_size=32)
    assert TINY.key() != other.key()
    assert cache_paths(TINY, "/c")[0] != cache_paths(other, "/c")[0]


def test_cache_env(monkeypatch, tmp_path):
    monkeypatch.setenv("FTLAB_CACHE", str(tmp_path))
    assert family.cache_dir() == tmp_path


def test_family_covers_the_settings():
    for src, tgt in family.SETTINGS.values():
        assert src in family.FAMILY and tgt in family.FAMILY
    a, w = family.FAMILY[family.SETTINGS["width"][0]], family.FAMILY[family.SETTINGS["width"][1]]
    assert w.width == 1.5 * a.width and w.depth == a.depth
    d = family.FAMILY[family.SETTINGS["depth"][1]]
    assert d.depth == 2 * a.depth and d.width == a.width
    p = family.FAMILY[family.SETTINGS["pretraining"][1]]
    assert (p.width, p.depth) == (a.width, a.depth) and p.data != a.data and p.seed != a.seed
