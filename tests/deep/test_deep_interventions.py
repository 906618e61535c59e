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


def test_absolute_scale_all_parameters_and_not_buffers(net):
    net.train()
    net(torch.randn(8, 1, 12, 12))  # non-trivial BN running stats
    before = _snapshot(net)
    rec = I.absolute_scale_(net, 4.0)
    _assert_factors(net, before, {n: 4.0 for n, _ in net.named_parameters()})
    assert rec.sq_norm_after == pytest.approx(16 * rec.sq_norm_before, rel=1e-5)


def test_absolute_scale_without_readout_norm_or_bias():
    m = modular_transformer(n_tokens=7, n_classes=7, d_model=8, n_heads=2, d_mlp=8, seed=1)
    before = _snapshot(m)
    I.absolute_scale_(m, 0.5, include_readout=False, include_bias=False)
    _assert_factors(m, before, {n: 0.5 for n, _ in m.named_parameters()
                                if not n.startswith("unembed.") and not n.endswith("bias")})


def test_double_application_guard(net):
    I.absolute_scale_(net, 0.5)
    with pytest.raises(ValueError, match="already applied"):
        I.absolute_scale_(net, 0.5)
    # after the parameters change (a training step), rescaling again is legitimate
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    net(torch.randn(4, 1, 12, 12)).sum().backward()
    opt.step()
    I.absolute_scale_(net, 0.5)
    I.absolute_scale_(net, 0.5, allow_repeat=True)


@pytest.mark.parametrize("gamma", [0.05, 1.0, 7.0])
def test_readout_normal_has_requested_scale_and_one_draw_up_to_scale(gamma):
    net = resnet18(width=16, in_channels=1, num_classes=10, seed=0)
    rec = I.reinit_readout_(net, gamma=gamma, out_features=200, seed=3)
    w = net.fc.weight.detach().double()
    assert tuple(w.shape) == (200, 128) and rec.shape == (200, 128)
    # 25,600 N(0, gamma^2/fan_in) draws: the sample std is within 2% of gamma/sqrt(fan_in)
    assert float(w.std()) == pytest.approx(gamma / math.sqrt(128), rel=0.02)
    assert torch.count_nonzero(net.fc.bias) == 0
    I.reinit_readout_(net, gamma=1.0, out_features=200, seed=3)  # same seed: the same draw, rescaled
    torch.testing.assert_close(w, net.fc.weight.detach().double() * gamma, rtol=1e-6, atol=1e-9)


def test_readout_zero_and_constant(net):
    I.reinit_readout_(net, gamma=0.0, mode="zero", out_features=2)
    assert torch.count_nonzero(net.fc.weight) == 0 and net.fc.out_features == 2
    I.reinit_readout_(net, gamma=0.25, mode="constant")
    assert torch.all(net.fc.weight == 0.25) and net(torch.randn(2, 1, 12, 12)).shape == (2, 2)


def _tokens(n_tokens, n=40):
    X = torch.randint(0, n_tokens, (n, 3))
    X[:, 2] = n_tokens
    return X


@pytest.mark.parametrize("target", [-0.9, 0.0, 0.7])
def test_set_balancedness_hits_target_and_preserves_the_function(target):
    m = modular_transformer(n_tokens=11, n_classes=11, d_model=16, n_heads=2, d_mlp=16, seed=0).double()
    with torch.no_grad():
        for p in m.parameters():  # a "trained" network: every bias and weight non-trivial
            p.add_(0.1 * torch.randn_like(p))
    X = _tokens(11)
    with torch.no_grad():
        y0 = m(X).clone()
    rec = I.set_balancedness_(m, target)
    assert I.balancedness(m) == pytest.approx(target, abs=1e-9) and rec.after == pytest.approx(target, abs=1e-9)
    with torch.no_grad():
        assert float((m(X) - y0).abs().max() / y0.abs().max()) < 1e-12


class _TinyTransformer(nn.Module):
    """A LayerNorm-free Transformer built here (two blocks, attention with biases, biased MLP)."""

    ftlab_embedding = "tok"
    ftlab_positional = "pos"
    ftlab_readout = "head"

    def __init__(self, act=nn.ReLU, norm=False):
        super().__init__()
        self.tok = nn.Embedding(9, 8)
        self.pos = nn.Parameter(torch.randn(4, 8))
        self.att = nn.ModuleList(nn.MultiheadAttention(8, 2, batch_first=True) for _ in range(2))
        self.mlp = nn.ModuleList(nn.Sequential(nn.Linear(8, 12), act(), nn.Linear(12, 8)) for _ in range(2))
        self.norm = nn.LayerNorm(8) if norm else nn.Identity()
        self.head = nn.Linear(8, 5)

    def forward(self, t):
        x = self.tok(t) + self.pos
        for a, f in zip(self.att, self.mlp):
            x = x + a(x, x, x, need_weights=False)[0]
            x = x + f(x)
        return self.head(self.norm(x).mean(1))


def test_stream_rescale_on_a_transformer_built_here():
    torch.manual_seed(0)
    m = _TinyTransformer().double()
    with torch.no_grad():
        for a in m.att:
            a.in_proj_bias.normal_()
            a.out_proj.bias.normal_()
    X = torch.randint(0, 9, (10, 4))
    with torch.no_grad():
        y0 = m(X).clone()
    e0 = float(m.tok.weight.detach().norm())
    assert I.rescale_stream_(m, 3.0) == 3.0
    assert float(m.tok.weight.detach().norm()) == pytest.approx(3 * e0)
    with torch.no_grad():
        assert float((m(X) - y0).abs().max() / y0.abs().max()) < 1e-12


@pytest.mark.parametrize("kw, needle", [(dict(norm=True), "LayerNorm"), (dict(act=nn.GELU), "GELU")])
def test_stream_rescale_refuses_normalization_and_other_activations(kw, needle):
    with pytest.raises(ValueError, match=needle):
        I.set_balancedness_(_TinyTransformer(**kw), 0.0)


def test_errors_are_one_line_value_errors(net):
    with pytest.raises(ValueError, match="s="):
        I.absolute_scale_(net, -1.0)
    with pytest.raises(ValueError, match="no recognizable readout"):
        I.reinit_readout_(nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU()), gamma=1.0)
    with pytest.raises(ValueError, match="target"):
        I.set_balancedness_(modular_transformer(n_tokens=5, n_classes=5, d_model=8, n_heads=2), 1.0)
    with pytest.raises(ValueError, match="ftlab_embedding"):
        I.balancedness(net)
    with pytest.raises(ValueError, match="a="):
        I.rescale_stream_(modular_transformer(n_tokens=5, n_classes=5, d_model=8, n_heads=2), 0.0)


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
