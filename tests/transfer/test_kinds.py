"""The layer-kind registry: every layer a transfer knows is recognised by exactly one kind, names are unique,
and what is not a registered kind or rule is refused naming the choices."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ftlab.transfer.kinds import (
    LayerKind,
    Point,
    Rule,
    kind_for_module,
    layer_kinds,
    register_kind,
    rule_kinds,
)

transformers = pytest.importorskip("transformers")


def _modules() -> dict[str, nn.Module]:
    """One module of every built-in kind, keyed by the kind expected to recognise it."""
    from transformers.pytorch_utils import Conv1D

    return {"linear": nn.Linear(3, 4), "hf_conv1d": Conv1D(4, 3), "attention": nn.MultiheadAttention(4, 2),
            "conv2d": nn.Conv2d(4, 6, 3, groups=2), "depthwise": nn.Conv2d(4, 4, 3, groups=4),
            "conv1d": nn.Conv1d(4, 4, 3, groups=4), "embedding": nn.Embedding(5, 4), "norm": nn.LayerNorm(4),
            "norm2d": nn.BatchNorm2d(4), "rms": nn.RMSNorm(4), "group": nn.GroupNorm(2, 4)}


def test_every_layer_is_recognised_by_exactly_one_kind():
    expected = {"rms": "norm", "group": "norm2d"}
    for key, mod in _modules().items():
        matching = [name for name, kind in layer_kinds().items() if kind.matches(mod)]
        assert matching == [expected.get(key, key)], (key, matching)
        assert kind_for_module(mod) is layer_kinds()[matching[0]]
    assert kind_for_module(nn.ReLU()) is None and kind_for_module(nn.Sequential()) is None


def test_kind_and_rule_names_are_checked():
    with pytest.raises(ValueError, match="already registered"):
        register_kind(layer_kinds()["linear"])

    class Unnamed(LayerKind):
        pass

    with pytest.raises(ValueError, match="unnamed"):
        register_kind(Unnamed())
    with pytest.raises(ValueError, match=r"point kind='dense' is invalid: must be one of .*\blinear\b"):
        Point("fc", "dense", 3, 4)
    with pytest.raises(ValueError, match=r"rule kind='scale' is invalid: must be one of .*\bweight_t\b"):
        Rule("fc.weight", "scale", "fc")
    with pytest.raises(ValueError, match="needs a point"):
        Rule("fc.weight", "weight")
    assert {"weight", "weight_t", "out_vector", "diagonal", "zero", "embedding"} <= set(rule_kinds())
    assert not Rule("x", "zero").carries and Rule("x", "weight", "fc").carries


def test_points_of_one_family_pair_and_others_do_not():
    kinds = layer_kinds()
    assert kinds["attention"].pairs_with(kinds["linear"]) and kinds["hf_conv1d"].pairs_with(kinds["linear"])
    assert not kinds["conv2d"].pairs_with(kinds["depthwise"]) and not kinds["param"].pairs_with(kinds["linear"])
    point = Point("fc", "linear", 3, 4)
    assert point.layer_kind is kinds["linear"]
    rows, grid = point.layer_kind.rows(torch.zeros(2, 5, 3), point, "in")
    assert rows.shape == (2, 5, 3) and grid is None
