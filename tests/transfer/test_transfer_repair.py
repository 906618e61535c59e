"""Statistics repair (re-pinned BatchNorm statistics) and the sharing of a source layer among target copies."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import ftlab.transfer.repair as repair_mod
from ftlab.transfer import TaskVector, TransferOptions, fit_transfer
from ftlab.transfer.layer_map import LayerMap
from ftlab.transfer.repair import concat_batches, fit_repair, running_norms


def _cnn(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                        nn.Conv2d(8, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 4))
    with torch.no_grad():  # non-trivial stored statistics and affine terms, as a pretrained net has
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.3)
    return net.eval()


def _batches(n: int = 3, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(5, 3, 6, 6, generator=g), torch.randint(0, 4, (5,), generator=g)) for _ in range(n)]


def _delta(net: nn.Module, **entries: torch.Tensor) -> TaskVector:
    state = {k: v for k, v in net.state_dict().items() if v.is_floating_point()}
    return TaskVector({k: entries.get(k.replace(".", "_"), torch.zeros_like(v)) for k, v in state.items()})


@pytest.mark.parametrize("mode", ["mean", "mean_std"])
def test_the_repair_of_the_untouched_base_changes_nothing_bit_for_bit(mode):
    net = _cnn()
    rep = fit_repair(net, _batches(), mode=mode)
    out = copy.deepcopy(net)
    rep.apply_(out)
    for k, v in net.state_dict().items():
        assert torch.equal(v, out.state_dict()[k]), k


def test_a_planted_channel_shift_is_removed_and_the_base_outputs_come_back():
    net = _cnn()
    shift = torch.linspace(-2.0, 3.0, 8)  # a per-channel bias shift of the first convolution
    tau = _delta(net, **{"0_bias": shift})
    changed = tau.apply(net, 1.0)
    x = torch.cat([b[0] for b in _batches()])
    with torch.no_grad():
        assert not torch.allclose(changed(x), net(x), atol=1e-3)
        repaired = fit_repair(net, _batches(), mode="mean").apply(changed)
        torch.testing.assert_close(repaired(x), net(x), rtol=1e-5, atol=1e-5)
    # the shift is absorbed by the stored mean of the BatchNorm right after the convolution
    torch.testing.assert_close(repaired[1].running_mean, net[1].running_mean + shift, rtol=1e-5, atol=1e-5)


def test_mean_std_also_removes_a_planted_change_of_spread_that_mean_alone_leaves():
    net = _cnn()
    w, b = net[0].weight.detach(), net[0].bias.detach()
    tau = _delta(net, **{"0_weight": w, "0_bias": b})  # the first convolution's output doubled
    changed = tau.apply(net, 1.0)
    x = torch.cat([bt[0] for bt in _batches()])
    with torch.no_grad():
        only_mean = fit_repair(net, _batches(), mode="mean").apply(changed)
        both = fit_repair(net, _batches(), mode="mean_std").apply(changed)
        torch.testing.assert_close(both(x), net(x), rtol=1e-4, atol=1e-5)
        assert not torch.allclose(only_mean(x), net(x), atol=1e-3)


def test_the_repaired_output_mean_of_every_layer_equals_the_base_on_the_calibration_inputs():
    net, other = _cnn(0), _cnn(5)
    tau = TaskVector.from_models(net, other)  # a large, unstructured change
    changed = tau.apply(net, 0.3)
    batches = _batches()
    repaired = fit_repair(net, batches, mode="mean").apply(changed)
    x = torch.cat([b[0] for b in batches])

    def means(model):
        seen = {}
        hooks = [m.register_forward_hook(lambda m, i, o, k=k: seen.__setitem__(k, o.double().mean((0, 2, 3))))
                 for k, m in running_norms(model).items()]
        with torch.no_grad():
            model(x)
        for h in hooks:
            h.remove()
        return seen

    base, fixed, raw = means(net), means(repaired), means(changed)
    for k in base:
        torch.testing.assert_close(fixed[k], base[k], rtol=1e-6, atol=1e-6)
    assert any((raw[k] - base[k]).abs().max() > 1e-2 for k in base)


def test_the_recorded_moments_merged_batch_by_batch_equal_those_of_the_joined_batches():
    """fit_repair runs the batches one at a time and merges each layer's input moments: the same means and spreads
    as one float64 computation over all calibration inputs, with batches of unequal size."""
    net = _cnn()
    g = torch.Generator().manual_seed(7)
    batches = [(torch.randn(k, 3, 6, 6, generator=g), torch.zeros(k, dtype=torch.long)) for k in (1, 5, 2)]
    rep = fit_repair(net, batches, mode="mean")
    seen: dict = {}
    hooks = [m.register_forward_pre_hook(lambda m, a, k=k: seen.setdefault(k, []).append(a[0].double()))
             for k, m in running_norms(net).items()]
    with torch.no_grad():
        for x, _ in batches:  # the same float32 activations as fit_repair's (a joined batch may round differently)
            net(x)
    for h in hooks:
        h.remove()
    assert set(seen) == set(rep.reference)
    for k, xs in seen.items():
        x = torch.cat(xs)
        torch.testing.assert_close(rep.reference[k].in_mean, x.mean((0, 2, 3)), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(rep.reference[k].in_std, x.std((0, 2, 3), unbiased=False), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", [(37, 5, 3, 4), (11, 6), (1, 3, 2)])
def test_channel_moments_in_float64_slices_agree_with_the_one_shot_float64_moments(monkeypatch, shape):
    g = torch.Generator().manual_seed(3)
    x = (3.0 + 2.0 * torch.randn(shape, generator=g)).float()
    monkeypatch.setattr(repair_mod, "_CHUNK", 7)  # several slices of the first axis (one sample each, or fewer)
    mean, std = repair_mod._channel_moments(x)
    dims = [0, *range(2, x.ndim)]
    ref_mean = x.double().mean(dim=dims)
    ref_std = x.double().var(dim=dims, unbiased=False).sqrt()
    assert torch.allclose(mean, ref_mean, rtol=1e-12, atol=0)
    assert torch.allclose(std, ref_std, rtol=1e-12, atol=0)


def test_a_model_without_running_statistics_has_nothing_to_repair_and_none_is_off():
    mlp = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 2))
    assert fit_repair(mlp, [torch.randn(2, 3)], mode="mean") is None
    assert fit_repair(_cnn(), _batches(), mode="none") is None


def test_batches_that_cannot_be_joined_are_a_one_line_error_naming_the_entry():
    with pytest.raises(ValueError, match=r"\['input_ids'\]"):
        concat_batches([{"input_ids": torch.zeros(2, 5)}, {"input_ids": torch.zeros(2, 7)}])
    with pytest.raises(ValueError, match="repair"):
        fit_repair(_cnn(), [], mode="mean")
    with pytest.raises(ValueError, match="repair"):
        TransferOptions(repair="always")


def test_the_transfer_records_the_repair_and_its_model_re_pins_the_statistics():
    a, b = _cnn(0), _cnn(2)
    a_ft = copy.deepcopy(a)
    with torch.no_grad():
        a_ft[0].bias.add_(1.5)  # a fine-tuning that mostly shifts channel means
    tau_a = TaskVector.from_models(a, a_ft)
    batches = _batches()

    def loss(model, batch):
        return nn.functional.cross_entropy(model(batch[0]), batch[1])

    plain = fit_transfer(a, a_ft, b, batches, loss, method="naive", options=TransferOptions(repair="none"))
    fixed = fit_transfer(a, tau_a, b, batches, loss, method="naive", options=TransferOptions(repair="mean"))
    assert plain.repair is None and fixed.repair is not None
    assert fixed.options["transfer"]["repair"] == "mean"
    torch.testing.assert_close(fixed.task_vector["0.bias"], plain.task_vector["0.bias"])  # tau_B itself is plain
    x = torch.cat([bt[0] for bt in batches])
    with torch.no_grad():
        drifted, repaired = plain.model(b, 1.0)(x), fixed.model(b, 1.0)(x)
    assert (repaired - b(x)).abs().max() < 1e-4 < (drifted - b(x)).abs().max()
    assert torch.equal(fixed.model(b, 0.0).state_dict()["1.running_mean"], b.state_dict()["1.running_mean"])


def _stack(widths: list[int], seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Linear(4, 4) for _ in widths])


@pytest.mark.parametrize("mode", ["sum", "split", "first"])
def test_copies_of_a_source_layer_share_its_update_by_rule(mode):
    lmap = LayerMap({"": [0, 0, 1, 1, 1]})  # target blocks 0-1 draw from source 0, blocks 2-4 from source 1
    names = [f"{j}.weight" for j in range(5)]
    w = lmap.copy_weights(names, mode)
    groups = [names[:2], names[2:]]
    for g in groups:
        total = sum(w[n] for n in g)
        assert total == pytest.approx({"sum": len(g), "split": 1.0, "first": 1.0}[mode])
    if mode == "first":
        assert [w[n] for n in names] == [1.0, 0.0, 1.0, 0.0, 0.0]


def test_a_deeper_target_takes_each_source_update_once_under_split_and_first():
    a, b = _stack([4] * 2, 0), _stack([4] * 4, 1)
    a_ft = copy.deepcopy(a)
    with torch.no_grad():
        for p in a_ft.parameters():
            p.add_(0.1)
    out = {}
    for mode in ("sum", "split", "first"):
        res = fit_transfer(a, a_ft, b, None, None, method="naive",
                           options=TransferOptions(copies=mode, depth_map="nearest_relative"))
        out[mode] = res.task_vector
        assert res.options["transfer"]["copies"] == mode
    src = out["sum"]
    assert sum(float(v.double().pow(2).sum()) for v in src.values()) > 0
    # nearest_relative 2 -> 4: blocks 0, 1 from source 0; blocks 2, 3 from source 1
    for j in range(4):
        k = f"{j}.weight"
        torch.testing.assert_close(out["split"][k], src[k] / 2)
        torch.testing.assert_close(out["first"][k], src[k] if j in (0, 2) else torch.zeros_like(src[k]))
