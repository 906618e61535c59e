"""Interventions change exactly what they claim to change, and refuse what they should."""

import math

import pytest
import torch
from torch import nn

from ftlab.deep import interventions as I
from ftlab.models.resnet import resnet18
from ftlab.models.transformer import modular_transformer


def _snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}, \
        {n: b.detach().clone() for n, b in model.named_buffers()}


def _assert_factors(model, before, expected):
    """Each parameter equals its old value times expected.get(name, 1); buffers unchanged."""
    params, buffers = before
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), params[n] * expected.get(n, 1.0), rtol=1e-6, atol=0)
    for n, b in model.named_buffers():
        assert torch.equal(b, buffers[n]), n


@pytest.fixture
def net():
    return resnet18(width=4, in_channels=1, num_classes=3, seed=0)


def test_rescale_multiplies_exactly_the_selection(net):
    sel = I.select(net, pattern=r"^layer3\.")
    assert sel.params and all(n.startswith("layer3.") for n in sel.params)
    before = _snapshot(net)
    rec = I.rescale_(net, sel, 0.3)
    _assert_factors(net, before, {n: 0.3 for n in sel.params})
    assert rec.sq_norm_after == pytest.approx(0.09 * rec.sq_norm_before, rel=1e-5)


def test_relative_scale_early_times_kappa_late_over_kappa(net):
    early, late = I.early_late(net)
    assert not set(early.params) & set(late.params)
    assert "fc.weight" not in early.params + late.params  # readout excluded by default
    # every parameter outside the readout is in exactly one group
    assert set(early.params) | set(late.params) == {n for n, _ in net.named_parameters() if not n.startswith("fc.")}
    assert early.params[0].startswith("stem.") and late.params[-1].startswith("layer4.")
    before = _snapshot(net)
    I.relative_scale_(net, 0.5)
    _assert_factors(net, before, {**{n: 0.5 for n in early.params}, **{n: 2.0 for n in late.params}})


def test_relative_scale_early_only_and_norm_exclusion(net):
    early = I.select(net, depth=(0.0, 0.5), include_norm=False, name="early")
    assert not any(".bn" in n or "shortcut.1" in n for n in early.params)
    before = _snapshot(net)
    I.relative_scale_(net, 3.0, mode="early", include_norm=False)
    _assert_factors(net, before, {n: 3.0 for n in early.params})


def test_absolute_scale_all_parameters_and_not_buffers(net):
    net.train()
    net(torch.randn(8, 1, 12, 12))  # non-trivial BN running stats
    before = _snapshot(net)
    I.absolute_scale_(net, 4.0)
    _assert_factors(net, before, {n: 4.0 for n, _ in net.named_parameters()})


def test_absolute_scale_without_readout():
    m = modular_transformer(n_tokens=7, n_classes=7, d_model=8, n_heads=2, d_mlp=8, seed=1)
    before = _snapshot(m)
    I.absolute_scale_(m, 0.5, include_readout=False)
    _assert_factors(m, before, {n: 0.5 for n, _ in m.named_parameters() if not n.startswith("unembed.")})


def test_predicate_selection(net):
    sel = I.select(net, predicate=lambda name, mod: isinstance(mod, nn.Conv2d) and name.startswith("layer1"))
    assert sel.params and all(n.startswith("layer1") and n.endswith("weight") and ".conv" in n for n in sel.params)


def test_double_application_guard(net):
    I.relative_scale_(net, 0.5)
    with pytest.raises(ValueError, match="already applied"):
        I.relative_scale_(net, 0.5)
    # after the parameters change (a training step), rescaling again is legitimate
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    net(torch.randn(4, 1, 12, 12)).sum().backward()
    opt.step()
    I.relative_scale_(net, 0.5)
    I.relative_scale_(net, 0.5, allow_repeat=True)
    sel = I.select(net, pattern="fc")
    I.rescale_(net, sel, 2.0)
    with pytest.raises(ValueError, match="already applied"):
        I.rescale_(net, sel, 2.0)


@pytest.mark.parametrize("gamma", [0.05, 1.0, 7.0])
def test_readout_normal_has_requested_scale(gamma):
    net = resnet18(width=16, in_channels=1, num_classes=10, seed=0)
    rec = I.reinit_readout_(net, gamma=gamma, out_features=200, seed=3)
    w = net.fc.weight.detach().double()
    assert tuple(w.shape) == (200, 128) and rec.shape == (200, 128)
    # 25,600 N(0, gamma^2/fan_in) draws: the sample std is within 2% of gamma/sqrt(fan_in)
    assert float(w.std()) == pytest.approx(gamma / math.sqrt(128), rel=0.02)
    assert abs(float(w.mean())) < 4 * gamma / math.sqrt(128) / math.sqrt(w.numel())
    assert torch.count_nonzero(net.fc.bias) == 0


def test_readout_zero_and_constant(net):
    I.reinit_readout_(net, gamma=0.0, mode="zero", out_features=2)
    assert torch.count_nonzero(net.fc.weight) == 0 and net.fc.out_features == 2
    I.reinit_readout_(net, gamma=0.25, mode="constant")
    assert torch.all(net.fc.weight == 0.25) and net(torch.randn(2, 1, 12, 12)).shape == (2, 2)


def test_set_balancedness_hits_target_and_preserves_product_or_total():
    m = modular_transformer(n_tokens=11, n_classes=11, d_model=16, n_heads=2, d_mlp=16, seed=0)
    E0 = float(m.embed.weight.detach().double().pow(2).sum())
    U0 = float(m.unembed.weight.detach().double().pow(2).sum())
    rec = I.set_balancedness_(m, -0.7)
    assert I.balancedness(m) == pytest.approx(-0.7, abs=1e-5)
    assert rec.factor_in * rec.factor_out == pytest.approx(1.0)
    E1 = float(m.embed.weight.detach().double().pow(2).sum())
    U1 = float(m.unembed.weight.detach().double().pow(2).sum())
    assert E1 * U1 == pytest.approx(E0 * U0, rel=1e-5)  # product-preserving
    I.set_balancedness_(m, 0.4, preserve="total")
    assert I.balancedness(m) == pytest.approx(0.4, abs=1e-5)
    assert float(m.embed.weight.detach().double().pow(2).sum() + m.unembed.weight.detach().double().pow(2).sum()) == \
        pytest.approx(E1 + U1, rel=1e-5)


def test_generic_models_get_units_and_readout():
    seq = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    name, ro = I.find_readout(seq)
    assert name == "4" and ro.out_features == 2
    assert I.depth_units(seq) == ["0", "2"]
    early, late = I.early_late(seq)
    assert early.params == ("0.weight", "0.bias") and late.params == ("2.weight", "2.bias")


def test_errors_are_one_line_value_errors(net):
    with pytest.raises(ValueError, match="matches no parameters"):
        I.select(net, pattern="no_such_layer")
    with pytest.raises(ValueError, match="kappa"):
        I.relative_scale_(net, 0.0)
    with pytest.raises(ValueError, match="s="):
        I.absolute_scale_(net, -1.0)
    with pytest.raises(ValueError, match="no recognizable readout"):
        I.reinit_readout_(nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU()), gamma=1.0)
    with pytest.raises(ValueError, match="target"):
        I.set_balancedness_(modular_transformer(n_tokens=5, n_classes=5, d_model=8, n_heads=2), 1.0)
    with pytest.raises(ValueError, match="exactly one"):
        I.select(net)


def test_batchnorm_recalibration_matches_batch_statistics():
    net = resnet18(width=2, in_channels=1, num_classes=2, seed=0)
    I.absolute_scale_(net, 3.0)  # stale running stats (still the init's 0 / 1)
    X = torch.randn(30, 1, 8, 8)
    assert I.recalibrate_batchnorm_(net, X, batch_size=10) == sum(
        isinstance(m, torch.nn.BatchNorm2d) for m in net.modules())
    with torch.no_grad():
        z = net.stem.conv(X).double()
    torch.testing.assert_close(net.stem.bn.running_mean.double(), z.mean(dim=(0, 2, 3)), rtol=1e-5, atol=1e-6)
    assert net.stem.bn.momentum == 0.1 and not net.training
