"""rebalance_: exact function preservation on networks built here, path products of 1, honest refusals."""

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ftlab.deep import rebalance_
from ftlab.models.cnn import nf_resnet18
from ftlab.models.resnet import resnet18


def _preserved(model, X, kappa, **kw):
    model.eval()
    with torch.no_grad():
        before = model(X).clone()
    rec = rebalance_(model, kappa, **kw)
    with torch.no_grad():
        after = model(X)
    rel = float((after - before).abs().max() / before.abs().max())
    return rec, rel


def _mlp(bias: bool):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 9, bias=bias), nn.ReLU(), nn.Linear(9, 7, bias=bias), nn.LeakyReLU(0.1),
                         nn.Linear(7, 5, bias=bias), nn.ReLU(), nn.Linear(5, 3, bias=bias)).double()


@pytest.mark.parametrize("kappa", [0.3, 2.5])
def test_plain_chain_gets_the_target_profile_exactly(kappa):
    net = _mlp(bias=False)
    norms = [float(net[i].weight.detach().norm()) for i in (0, 2, 4, 6)]
    rec, rel = _preserved(net, torch.randn(11, 6, dtype=torch.float64), kappa)
    assert rel < 1e-12
    # depth fractions 0, 1/3, 2/3, 1 -> factors kappa^(1 - 2d); their product is 1
    expected = [kappa ** (1 - 2 * d) for d in (0, 1 / 3, 2 / 3, 1)]
    assert [u.factor for u in rec.units] == pytest.approx(expected, rel=1e-12)
    assert math.prod(u.factor for u in rec.units) == pytest.approx(1.0, abs=1e-12)
    assert rec.factor("0") == pytest.approx(kappa) and rec.factor("6") == pytest.approx(1 / kappa)
    assert float(net[0].weight.detach().norm()) == pytest.approx(kappa * norms[0])  # kappa < 1: weight norm leaves layer 1
    assert rec.residual < 1e-12 and all(math.isnan(u.lr_factor) for u in rec.units)


@pytest.mark.parametrize("scale", [0.25, 4.0])
def test_scale_multiplies_the_function_exactly(scale):
    torch.manual_seed(3)
    net = _Branchy().double()
    X = torch.randn(5, 2, 8, 8, dtype=torch.float64)
    with torch.no_grad():
        before = net(X).clone()
    rec = rebalance_(net, scale=scale)
    with torch.no_grad():
        torch.testing.assert_close(net(X), scale * before, rtol=1e-12, atol=1e-12)
    assert rec.scale == scale and rec.residual < 1e-12
    chain = _mlp(bias=True)
    Y = torch.randn(4, 6, dtype=torch.float64)
    with torch.no_grad():
        before = chain(Y).clone()
    rec = rebalance_(chain, 2.0, scale=scale)  # both at once: kappa profile and output scale
    with torch.no_grad():
        torch.testing.assert_close(chain(Y), scale * before, rtol=1e-12, atol=1e-12)
    assert [u.factor for u in rec.units] == pytest.approx(
        [2.0 ** (1 - 2 * d) * scale ** 0.25 for d in (0, 1 / 3, 2 / 3, 1)], rel=1e-12)


def test_biases_scale_with_the_cumulative_factor():
    net = _mlp(bias=True)
    b0 = [net[i].bias.detach().clone() for i in (0, 2, 4, 6)]
    rec, rel = _preserved(net, torch.randn(11, 6, dtype=torch.float64), 0.4)
    assert rel < 1e-12
    cum = 1.0
    for u, i, b in zip(rec.units, (0, 2, 4, 6), b0):
        cum *= u.factor
        assert u.bias_factor == pytest.approx(cum)
        torch.testing.assert_close(net[i].bias.detach(), b * cum)
    assert rec.units[-1].bias_factor == pytest.approx(1.0)  # the output keeps its scale


class _Branchy(nn.Module):
    """Residual stages (identity and 1x1 projection skips), pooling, a concatenation of two branches, a
    learnable scalar gain, a hand-added bias, a module used twice, F.linear on a parameter and a bare
    projection ``x @ P`` -- everything rebalance_ claims to handle."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(2, 4, 3, padding=1, bias=False)
        self.a1 = nn.Conv2d(4, 4, 3, padding=1)
        self.a2 = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.gain = nn.Parameter(torch.tensor(0.7))
        self.down = nn.Conv2d(4, 6, 3, stride=2, padding=1, bias=False)
        self.proj = nn.Conv2d(4, 6, 1, stride=2, bias=False)
        self.left = nn.Conv2d(6, 3, 1, bias=False)
        self.right = nn.Conv2d(6, 3, 3, padding=1, bias=False)
        self.shared = nn.Conv2d(6, 6, 3, padding=1, bias=False)
        self.shift = nn.Parameter(torch.randn(1, 6, 1, 1))
        self.w = nn.Parameter(torch.randn(5, 6))
        self.b = nn.Parameter(torch.randn(5))
        self.P = nn.Parameter(torch.randn(5, 3))
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        h = F.relu(self.stem(x))
        h = F.relu(h + self.gain * self.a2(F.relu(self.a1(h))))
        h = F.relu(self.down(h)) + self.proj(h)
        h = F.max_pool2d(h, 1)
        h = torch.cat([self.left(h), self.right(h)], dim=1)
        h = F.relu(self.shared(F.relu(self.shared(h))) + self.shift)
        h = torch.flatten(self.pool(h), 1)
        return F.relu(F.linear(h, self.w, self.b)) @ self.P


def test_residual_concat_gain_sharing_and_bare_projection_network():
    torch.manual_seed(1)
    net = _Branchy().double()
    rec, rel = _preserved(net, torch.randn(7, 2, 8, 8, dtype=torch.float64), 0.5)
    assert rel < 1e-12 and rec.residual < 1e-12
    f = {u.name: u.factor for u in rec.units}
    # the product along every input-to-output path is 1 (function preservation for every input):
    tail = f["shared"] ** 2 * f["w"] * f["P"]
    for path in (f["stem"] * f["proj"] * f["left"], f["stem"] * f["a1"] * f["a2"] * f["gain"] * f["down"] * f["right"],
                 f["stem"] * f["down"] * f["left"], f["stem"] * f["a1"] * f["a2"] * f["gain"] * f["proj"] * f["right"]):
        assert path * tail == pytest.approx(1.0, rel=1e-12)
    assert f["a1"] * f["a2"] * f["gain"] == pytest.approx(1.0)  # an identity skip leaves the branch product 1
    assert f["stem"] < 1 < f["P"]  # kappa < 1: early smaller, readout larger


def test_embedding_first_layer():
    torch.manual_seed(2)
    net = nn.Sequential(nn.Embedding(10, 6), nn.ReLU(), nn.Flatten(), nn.Linear(18, 4), nn.ReLU(), nn.Linear(4, 2)).double()
    rec, rel = _preserved(net, torch.randint(0, 10, (9, 3)), 3.0)
    assert rel < 1e-12 and rec.factor("0") == pytest.approx(3.0) and rec.factor("5") == pytest.approx(1 / 3.0)


def test_ftlab_normalization_free_resnet_is_rebalanced_exactly_in_float32():
    net = nf_resnet18(width=4, in_channels=1, num_classes=3, seed=0)
    for m in net.modules():
        if hasattr(m, "gain"):
            nn.init.constant_(m.gain, 0.8)
    rec, rel = _preserved(net, torch.randn(6, 1, 14, 14), 0.5)
    assert rel < 1e-5 and rec.factor("fc") > 1 > rec.factor("stem.0")


def test_batchnorm_network_absorb_mode_only_changes_effective_learning_rates():
    net = resnet18(width=4, in_channels=1, num_classes=3, seed=0).double()
    net.train()
    with torch.no_grad():
        for _ in range(3):
            net(torch.randn(16, 1, 12, 12, dtype=torch.float64) * 2 + 1)  # non-trivial running statistics
    X = torch.randn(6, 1, 12, 12, dtype=torch.float64)
    net.train()
    with torch.no_grad():
        train_before = net(X).clone()
    rec, rel = _preserved(net, X, 0.5, normalization="absorb")
    assert rel < 1e-4  # eval mode, exact up to BatchNorm's eps (running statistics rescaled)
    net.train()
    with torch.no_grad():
        # train mode (batch statistics of 6 images; eps matters more at the deepest, smallest maps)
        assert float((net(X) - train_before).abs().max() / train_before.abs().max()) < 1e-3
    assert rec.factor("fc") == 1.0 and rec.factor("stem.conv") == pytest.approx(0.5)
    for u in rec.units:
        if u.name != "fc":
            assert u.normalized and u.lr_factor == pytest.approx(1 / u.factor**2)


def _one_line(exc_info) -> str:
    msg = str(exc_info.value)
    assert "\n" not in msg
    return msg


class _AddConst(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 3, bias=False), nn.Linear(3, 2, bias=False)

    def forward(self, x):
        return self.b(F.relu(self.a(x)) + 1.0)


class _Gelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 3, bias=False), nn.Linear(3, 2, bias=False)

    def forward(self, x):
        return self.b(F.gelu(self.a(x)))


class _Branching(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 3, bias=False), nn.Linear(3, 2, bias=False)

    def forward(self, x):
        if x.sum() > 0:
            return self.b(self.a(x))
        return self.b(x)


class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 3, bias=False), nn.Linear(3, 3, bias=False)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.b(F.relu(self.a(x)))


@pytest.mark.parametrize("make, needle", [
    (lambda: resnet18(width=2, in_channels=1, num_classes=2), "BatchNorm2d, which divides out"),
    (lambda: nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3), nn.Linear(3, 2)), "LayerNorm"),
    (lambda: nn.Sequential(nn.Linear(3, 3), nn.GELU(), nn.Linear(3, 2)), "not positively homogeneous"),
    (lambda: nn.Sequential(nn.Linear(3, 3), nn.Sigmoid(), nn.Linear(3, 2)), "Sigmoid"),
    (lambda: nn.Sequential(nn.Linear(3, 3), nn.ReLU6(), nn.Linear(3, 2)), "ReLU6"),
    (_Gelu, "gelu"),
    (_AddConst, "adds a constant"),
    (_Branching, "cannot trace"),
    (_Tied, "shared"),
    (lambda: nn.Sequential(nn.Linear(3, 2)), "at least two"),
    (lambda: nn.Sequential(nn.ReLU()), "no weighted layer"),
])
def test_refusals_are_one_line_value_errors(make, needle):
    with pytest.raises(ValueError) as exc:
        rebalance_(make(), 0.5)
    assert needle in _one_line(exc)


def test_attention_is_refused_and_kappa_is_validated():
    mha = nn.MultiheadAttention(4, 2, batch_first=True)

    class Att(nn.Module):
        def __init__(self):
            super().__init__()
            self.att, self.out = mha, nn.Linear(4, 2)

        def forward(self, x):
            return self.out(self.att(x, x, x)[0])

    with pytest.raises(ValueError) as exc:
        rebalance_(Att(), 0.5)
    assert "MultiheadAttention" in _one_line(exc)
    with pytest.raises(ValueError, match="kappa"):
        rebalance_(_mlp(False), 0.0)
    with pytest.raises(ValueError, match="scale"):
        rebalance_(_mlp(False), scale=-1.0)
    with pytest.raises(ValueError, match="normalization"):
        rebalance_(_mlp(False), 0.5, normalization="ignore")  # type: ignore[arg-type]
