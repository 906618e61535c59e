"""Declared interfaces of the transfer part: the Method protocol, the registry, the run record."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch
from torch import nn

from ftlab.transfer import (
    Method,
    TaskVector,
    TransferOptions,
    fit_transfer,
    get_method,
    list_methods,
    split_options,
    transfer,
)
from ftlab.transfer.spec import Rule

pytestmark = pytest.mark.filterwarnings("ignore::ftlab.transfer.align.RankWarning")


def _pair():
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    ft = copy.deepcopy(a)
    with torch.no_grad():
        for p in ft.parameters():
            p.add_(0.1 * torch.randn_like(p))
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 4, generator=g, dtype=torch.float64), torch.randn(16, 3, generator=g, dtype=torch.float64))
               for _ in range(3)]
    return a, ft, batches


def _loss(model, batch):
    return (model(batch[0]) - batch[1]).pow(2).mean()


def test_every_registered_method_satisfies_the_protocol_with_frozen_validated_options():
    names = [m.name for m in list_methods()]
    assert {"bico", "bico_input_only", "bico_output_only", "activation_only", "gradient_only", "naive", "identity",
            "gradfix"} <= set(names)
    for info in list_methods():
        m = get_method(info.name)
        assert isinstance(m, Method) and m.name == info.name
        assert dataclasses.is_dataclass(m.options)
        field = dataclasses.fields(m.options)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(m.options, field, getattr(m.options, field))
        with pytest.raises(ValueError, match=f"invalid option 'nope' for method '{info.name}'"):
            get_method(info.name, nope=1)
    with pytest.raises(ValueError, match="whiten_p=0.9"):
        get_method("bico", whiten_p=0.9)


def test_every_registered_method_runs_through_transfer_by_its_name_alone():
    """One door: each method gets what it declares it reads (statistics, target gradients, both bases) from
    transfer() itself; the caller names the method and nothing else."""
    a, ft, batches = _pair()
    b = copy.deepcopy(a)
    with torch.no_grad():
        for p in b.parameters():
            p.add_(0.05 * torch.randn_like(p))
    names = set(TaskVector.from_models(b, b))
    for info in list_methods():
        tv = transfer(a, ft, b, batches, _loss, method=info.name)
        assert set(tv) == names and all(torch.isfinite(v).all() for v in tv.values()), info.name
        assert tv.norm() > 0, info.name


def test_the_paper_ablations_fit_one_side_only():
    bi, inp, out = get_method("bico"), get_method("bico_input_only"), get_method("bico_output_only")
    assert (bi.options.in_map, bi.options.out_map) == ("act", "grad")
    assert (inp.options.in_map, inp.options.out_map) == ("act", "naive")
    assert (out.options.in_map, out.options.out_map) == ("naive", "grad")


def test_the_run_record_holds_every_option_and_is_json():
    a, ft, batches = _pair()
    overrides = {"2.bias": [Rule("2.bias", "zero")]}
    opts = TransferOptions(zero_params=("*nothing*",), target_overrides=overrides, diagnostics=True,
                           batch_dtype=torch.float64, padding_mask=lambda b: None)
    m = get_method("bico", center=True)
    res = fit_transfer(a, ft, copy.deepcopy(a), batches, _loss, method=m, options=opts)
    rec = json.loads(json.dumps(res.report()))["options"]
    assert rec["method"] == json.loads(json.dumps({"name": "bico", **dataclasses.asdict(m.options)}))
    assert rec["method"]["center"] is True and rec["method"]["in_map"] == "act"
    t = rec["transfer"]
    assert t["zero_params"] == ["*nothing*"] and t["batch_dtype"] == "float64" and t["diagnostics"] is True
    assert t["target_overrides"] == {"2.bias": [{"param": "2.bias", "kind": "zero", "point": None, "part": [0, 1]}]}
    assert "test_transfer_interfaces" in t["padding_mask"]["callable"]  # callables by their qualified name
    assert set(t) == set(TransferOptions.field_names())


def test_flat_keyword_options_split_between_transfer_and_method():
    opts, m = split_options("bico", {"depth_map": "prefix", "center": True, "seq_align": "mean"})
    assert (opts.depth_map, opts.seq_align, m.options.center) == ("prefix", "mean", True)
    a, ft, batches = _pair()
    with pytest.raises(ValueError, match="invalid option 'centre' for method 'bico'"):
        transfer(a, ft, copy.deepcopy(a), batches, _loss, centre=True)
