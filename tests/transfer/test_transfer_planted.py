"""Planted problems: B is an exact re-coding of A, so the true tau_B is known in closed form.

If every hidden space s of B is a re-coding x_B = M_s^T x_A of A's (M_s orthogonal, or
semi-orthogonal with orthonormal rows for a wider B), then B computes the same function,
activations and output gradients are exact re-codings, and the fine-tuned B is the re-coding of
the fine-tuned A: tau_B = M_out^T tau_A M_in per layer. Re-codings commute with ReLU only when
they are permutations (plus zero "dead" units); purely linear paths take any orthogonal map.
For a narrower B, A is built as B's network embedded with dead units, and the best tau_B is the
projection M^T tau_A M onto the space A's data actually use.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ftlab.transfer import TransferOptions, fit_transfer, transfer

torch.set_num_threads(1)
DT = torch.float64


def perm_embed(n_from: int, n_to: int, g: torch.Generator) -> torch.Tensor:
    """``n_from x n_to`` permutation-with-padding: orthonormal rows (wider) or columns (narrower)."""
    M = torch.zeros(n_from, n_to, dtype=DT)
    k = min(n_from, n_to)
    rows = torch.randperm(n_from, generator=g)[:k]
    cols = torch.randperm(n_to, generator=g)[:k]
    M[rows, cols] = 1.0
    return M


def ortho(n_from: int, n_to: int, g: torch.Generator) -> torch.Tensor:
    """A random ``n_from x n_to`` matrix with orthonormal rows (n_from <= n_to) or columns."""
    big, small = max(n_from, n_to), min(n_from, n_to)
    Q, _ = torch.linalg.qr(torch.randn(big, small, generator=g, dtype=DT))
    return Q.T if n_from <= n_to else Q


def lin(W, M_out, M_in):
    return M_out.T @ W @ M_in


def rel_err(tv, truth) -> float:
    num = sum(float((tv[k].double() - truth[k]).pow(2).sum()) for k in truth)
    den = sum(float(truth[k].pow(2).sum()) for k in truth)
    return (num / den) ** 0.5


def perturb(model: nn.Module, seed: int, scale: float = 0.05) -> nn.Module:
    import copy

    g = torch.Generator().manual_seed(seed)
    ft = copy.deepcopy(model)
    with torch.no_grad():
        for p in ft.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return ft


def mse_loss(model, batch):
    x, y = batch
    return F.mse_loss(model(x), y, reduction="sum")


# ---------------------------------------------------------------------------------------------
# MLP: x -> fc1 -> ReLU -> fc2 -> fc3 (fc2 -> fc3 is linear, so its space takes any rotation)


class MLP(nn.Module):
    def __init__(self, d, h1, h2, o):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(d, h1), nn.Linear(h1, h2), nn.Linear(h2, o)

    def forward(self, x):
        return self.fc3(self.fc2(torch.relu(self.fc1(x))))


def recode_mlp(src: MLP, M1, M2) -> MLP:
    d, o = src.fc1.in_features, src.fc3.out_features
    dst = MLP(d, M1.shape[1], M2.shape[1], o).double()
    I_in, I_out = torch.eye(d, dtype=DT), torch.eye(o, dtype=DT)
    with torch.no_grad():
        dst.fc1.weight.copy_(lin(src.fc1.weight, M1, I_in))
        dst.fc1.bias.copy_(M1.T @ src.fc1.bias)
        dst.fc2.weight.copy_(lin(src.fc2.weight, M2, M1))
        dst.fc2.bias.copy_(M2.T @ src.fc2.bias)
        dst.fc3.weight.copy_(lin(src.fc3.weight, I_out, M2))
        dst.fc3.bias.copy_(src.fc3.bias)
    return dst


def mlp_truth(tau, M1, M2):
    d, o = tau["fc1.weight"].shape[1], tau["fc3.weight"].shape[0]
    I_in, I_out = torch.eye(d, dtype=DT), torch.eye(o, dtype=DT)
    return {"fc1.weight": lin(tau["fc1.weight"], M1, I_in), "fc1.bias": M1.T @ tau["fc1.bias"],
            "fc2.weight": lin(tau["fc2.weight"], M2, M1), "fc2.bias": M2.T @ tau["fc2.bias"],
            "fc3.weight": lin(tau["fc3.weight"], I_out, M2), "fc3.bias": tau["fc3.bias"]}


def regression_batches(d, o, n_batches=4, n=64, seed=0, shape=None):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(*(shape or (n, d)), generator=g, dtype=DT), torch.randn(n, o, generator=g, dtype=DT))
            for _ in range(n_batches)]


@pytest.mark.parametrize("h1b,h2b", [(10, 8), (14, 12)], ids=["square", "wider"])
def test_bico_recovers_planted_mlp(h1b, h2b):
    g = torch.Generator().manual_seed(1)
    torch.manual_seed(1)
    A = MLP(6, 10, 8, 8).double()  # 8 outputs: gradients at fc2 (a linear path) have rank <= 8
    A_ft = perturb(A, 2)
    M1, M2 = perm_embed(10, h1b, g), ortho(8, h2b, g)
    B = recode_mlp(A, M1, M2)
    # sanity of the construction: B computes A's function
    x = torch.randn(5, 6, dtype=DT)
    assert torch.allclose(B(x), A(x), atol=1e-12)
    tau_a = {k: v.detach() for k, v in A_ft.state_dict().items()}
    tau_a = {k: tau_a[k] - A.state_dict()[k] for k in tau_a}
    truth = mlp_truth(tau_a, M1, M2)
    tv = transfer(A, A_ft, B, regression_batches(6, 8), mse_loss)
    assert rel_err(tv, truth) < 1e-6
    if h2b > 8:  # isometric embedding: nothing is lost
        assert abs(tv.norm() - (sum(float(v.pow(2).sum()) for v in tau_a.values())) ** 0.5) < 1e-6 * tv.norm()
    # pad/truncate ignores the re-coding and is far off
    tv_naive = transfer(A, A_ft, B, method="naive")
    assert rel_err(tv_naive, truth) > 0.1


def test_bico_narrower_target_gets_the_best_projection():
    """A = a 6-wide hidden network embedded into widths (10, 8) with dead units; B is narrower."""
    g = torch.Generator().manual_seed(3)
    torch.manual_seed(3)
    N = MLP(6, 6, 5, 5).double()  # the live network
    E1, E2 = perm_embed(6, 10, g), ortho(5, 8, g)  # N -> A (orthonormal rows: isometric)
    A = recode_mlp(N, E1, E2)
    A_ft = perturb(A, 4)  # touches the dead units too: B cannot represent that part
    P1, P2 = perm_embed(6, 6, g), ortho(5, 5, g)  # N -> B (square)
    B = recode_mlp(N, P1, P2)
    M1, M2 = E1.T @ P1, E2.T @ P2  # A -> B maps, orthonormal columns (projections)
    tau_a = {k: A_ft.state_dict()[k] - A.state_dict()[k] for k in A.state_dict()}
    truth = mlp_truth(tau_a, M1, M2)
    res = fit_transfer(A, A_ft, B, regression_batches(6, 5), mse_loss, options=TransferOptions(diagnostics=True))
    assert rel_err(res.task_vector, truth) < 1e-6
    # a projection: part of tau_A is lost, and what is kept is the least-squares best
    full = sum(float(v.pow(2).sum()) for v in tau_a.values()) ** 0.5
    assert res.task_vector.norm() < 0.95 * full
    W = tau_a["fc2.weight"]
    best = M2 @ res.task_vector["fc2.weight"].double() @ M1.T
    g2 = torch.Generator().manual_seed(9)
    for _ in range(5):
        other = res.task_vector["fc2.weight"].double() + 0.01 * torch.randn(5, 6, generator=g2, dtype=DT)
        assert torch.linalg.norm(W - best) < torch.linalg.norm(W - M2 @ other @ M1.T)
    # the fitted maps reproduce B's rows from A's exactly (residual ~ 0) while pad/truncate does not
    for rec in res.layers():
        assert rec["out_residual_fit"] < 1e-6
        assert rec["out_cka_fit"] == pytest.approx(1.0, abs=1e-9)  # A's rows mapped by R are B's rows
        if "in_residual_fit" in rec and rec["target"] != "fc1":
            assert rec["in_residual_naive"] > 1e-3
            assert rec["in_cka_fit"] == pytest.approx(1.0, abs=1e-9) and rec["in_cka_naive"] < 0.99


# ---------------------------------------------------------------------------------------------
# CNN: conv1 -> ReLU -> conv2 -> conv3 -> ReLU -> global mean -> fc


class CNN(nn.Module):
    def __init__(self, c1, c2, c3, o=3):
        super().__init__()
        self.conv1 = nn.Conv2d(3, c1, 3, padding=1)
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1, stride=2)
        self.conv3 = nn.Conv2d(c2, c3, 3, padding=1)  # 3x3: gradients at conv2 are not rank-limited by c3
        self.fc = nn.Linear(c3, o)

    def forward(self, x):
        h = torch.relu(self.conv3(self.conv2(torch.relu(self.conv1(x)))))
        return self.fc(h.mean((2, 3)))


def conv_recode(W, M_out, M_in):
    return torch.einsum("oa,oikl,ib->abkl", M_out, W, M_in)


def recode_cnn(src: CNN, M1, M2, M3) -> CNN:
    dst = CNN(M1.shape[1], M2.shape[1], M3.shape[1]).double()
    I3, Io = torch.eye(3, dtype=DT), torch.eye(3, dtype=DT)
    with torch.no_grad():
        for name, Mo, Mi in (("conv1", M1, I3), ("conv2", M2, M1), ("conv3", M3, M2)):
            getattr(dst, name).weight.copy_(conv_recode(getattr(src, name).weight, Mo, Mi))
            getattr(dst, name).bias.copy_(Mo.T @ getattr(src, name).bias)
        dst.fc.weight.copy_(lin(src.fc.weight, Io, M3))
        dst.fc.bias.copy_(src.fc.bias)
    return dst


def test_bico_recovers_planted_cnn_wider():
    g = torch.Generator().manual_seed(5)
    torch.manual_seed(5)
    A = CNN(4, 5, 4).double()
    A_ft = perturb(A, 6)
    M1, M2, M3 = perm_embed(4, 6, g), ortho(5, 7, g), perm_embed(4, 5, g)
    B = recode_cnn(A, M1, M2, M3)
    x = torch.randn(2, 3, 8, 8, dtype=DT)
    assert torch.allclose(B(x), A(x), atol=1e-12)
    sa, sf = A.state_dict(), A_ft.state_dict()
    tau = {k: sf[k] - sa[k] for k in sa}
    I3 = torch.eye(3, dtype=DT)
    truth = {}
    for name, Mo, Mi in (("conv1", M1, I3), ("conv2", M2, M1), ("conv3", M3, M2)):
        truth[f"{name}.weight"] = conv_recode(tau[f"{name}.weight"], Mo, Mi)
        truth[f"{name}.bias"] = Mo.T @ tau[f"{name}.bias"]
    truth["fc.weight"], truth["fc.bias"] = tau["fc.weight"] @ M3, tau["fc.bias"]
    batches = regression_batches(0, 3, n_batches=3, n=16, shape=(16, 3, 8, 8))
    tv = transfer(A, A_ft, B, batches, mse_loss)
    assert rel_err(tv, truth) < 1e-6


# ---------------------------------------------------------------------------------------------
# Transformer: Embedding -> 2 x nn.TransformerEncoderLayer (pre-LN) -> mean -> head.
# Residual stream: permutation (LayerNorm is only permutation-equivariant); attention: per-head
# rotations shared by q and k, other rotations for v, heads permuted; FFN: permutation with dead units.
# Pre-LN and random LayerNorm gains/biases keep every row space full rank: a post-LN residual
# stream only carries gradients orthogonal to the all-ones vector, and LayerNorm outputs with
# zero bias lie in a hyperplane, which would leave one direction of those maps undetermined.


class TinyTransformer(nn.Module):
    def __init__(self, vocab=20, d=8, heads=2, ff=12, layers=2, o=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True, norm_first=True)
                                    for _ in range(layers))
        self.head = nn.Linear(d, o)
        with torch.no_grad():
            for n, p in self.named_parameters():
                if ".norm" in n:
                    p.add_(0.3 * torch.randn_like(p))

    def forward(self, ids):
        h = self.emb(ids)
        for layer in self.layers:
            h = layer(h)
        return self.head(h.mean(1))


def head_rotation(heads, hd, g, perm):
    """Rotate inside each head, then permute the heads (q, k and v must share ``perm``)."""
    M = torch.block_diag(*[ortho(hd, hd, g) for _ in range(heads)])
    P = torch.zeros(heads * hd, heads * hd, dtype=DT)
    for i, j in enumerate(perm.tolist()):
        P[i * hd:(i + 1) * hd, j * hd:(j + 1) * hd] = torch.eye(hd, dtype=DT)
    return M @ P


def transformer_maps(model, ff_b, g):
    d = model.emb.embedding_dim
    heads = model.layers[0].self_attn.num_heads
    maps = {"res": perm_embed(d, d, g)}
    for i, layer in enumerate(model.layers):
        perm = torch.randperm(heads, generator=g)
        maps[f"qk{i}"] = head_rotation(heads, d // heads, g, perm)
        maps[f"v{i}"] = head_rotation(heads, d // heads, g, perm)
        maps[f"ff{i}"] = perm_embed(layer.linear1.out_features, ff_b, g)
    return maps


def recode_transformer_state(state, maps, n_layers, o):
    P = maps["res"]
    Io = torch.eye(o, dtype=DT)
    out = {"emb.weight": state["emb.weight"] @ P, "head.weight": lin(state["head.weight"], Io, P),
           "head.bias": state["head.bias"]}
    for i in range(n_layers):
        p = f"layers.{i}."
        Mqk, Mv, Mf = maps[f"qk{i}"], maps[f"v{i}"], maps[f"ff{i}"]
        Wq, Wk, Wv = state[p + "self_attn.in_proj_weight"].chunk(3)
        bq, bk, bv = state[p + "self_attn.in_proj_bias"].chunk(3)
        out[p + "self_attn.in_proj_weight"] = torch.cat([lin(Wq, Mqk, P), lin(Wk, Mqk, P), lin(Wv, Mv, P)])
        out[p + "self_attn.in_proj_bias"] = torch.cat([Mqk.T @ bq, Mqk.T @ bk, Mv.T @ bv])
        out[p + "self_attn.out_proj.weight"] = lin(state[p + "self_attn.out_proj.weight"], P, Mv)
        out[p + "self_attn.out_proj.bias"] = P.T @ state[p + "self_attn.out_proj.bias"]
        out[p + "linear1.weight"] = lin(state[p + "linear1.weight"], Mf, P)
        out[p + "linear1.bias"] = Mf.T @ state[p + "linear1.bias"]
        out[p + "linear2.weight"] = lin(state[p + "linear2.weight"], P, Mf)
        out[p + "linear2.bias"] = P.T @ state[p + "linear2.bias"]
        for n in ("norm1", "norm2"):
            out[p + n + ".weight"] = P.T @ state[p + n + ".weight"]
            out[p + n + ".bias"] = P.T @ state[p + n + ".bias"]
    return out


@pytest.mark.parametrize("ff_b", [12, 16], ids=["square", "wider"])
def test_bico_recovers_planted_transformer(ff_b):
    g = torch.Generator().manual_seed(7)
    torch.manual_seed(7)
    A = TinyTransformer().double()
    A_ft = perturb(A, 8)
    maps = transformer_maps(A, ff_b, g)
    B = TinyTransformer(ff=ff_b).double()
    B.load_state_dict(recode_transformer_state(A.state_dict(), maps, 2, 8))
    ids = torch.randint(0, 20, (3, 6), generator=g)
    assert torch.allclose(B(ids), A(ids), atol=1e-10)
    sa, sf = A.state_dict(), A_ft.state_dict()
    tau = {k: sf[k] - sa[k] for k in sa}
    truth = recode_transformer_state(tau, maps, 2, 8)
    batches = [(torch.randint(0, 20, (8, 6), generator=g), torch.randn(8, 8, generator=g, dtype=DT)) for _ in range(4)]
    res = fit_transfer(A, A_ft, B, batches, mse_loss, options=TransferOptions(diagnostics=True))
    tv = res.task_vector
    assert rel_err(tv, truth) < 1e-6
    # every map is an isometry here, so each layer's delta keeps its norm and B's rows are reproduced
    for rec in res.layers():
        assert rec["target_norm"] == pytest.approx(rec["source_norm"], rel=1e-6)
        assert rec["out_residual_fit"] < 1e-6
    assert rel_err(transfer(A, A_ft, B, method="naive"), truth) > 0.1


def test_ablations_use_their_own_statistics():
    """On the square planted MLP the statistics differ in rank, which tells the methods apart.

    fc1's output *activations* have rank <= d + 1 = 7 < 10 (an affine image of 6-dim data), so an
    output map fitted on activations (activation-only) is partly arbitrary there, while the output
    *gradients* (masked by the ReLU per sample) have full rank and BiCo is exact. fc3's input
    activations and input gradients are both full rank, so every variant gets fc3 exactly.
    """
    from ftlab.transfer.align import RankWarning

    g = torch.Generator().manual_seed(1)
    torch.manual_seed(1)
    A = MLP(6, 10, 8, 8).double()
    A_ft = perturb(A, 2)
    M1, M2 = perm_embed(10, 10, g), ortho(8, 8, g)
    B = recode_mlp(A, M1, M2)
    tau_a = {k: A_ft.state_dict()[k] - A.state_dict()[k] for k in A.state_dict()}
    truth = mlp_truth(tau_a, M1, M2)
    data = regression_batches(6, 8)
    only = lambda tv, k: rel_err({k: tv[k]}, {k: truth[k]})  # noqa: E731
    bico = transfer(A, A_ft, B, data, mse_loss)
    with pytest.warns(RankWarning, match=r"fc1 \(out\): the act map"):
        act = transfer(A, A_ft, B, data, mse_loss, method="activation_only")
    with pytest.warns(RankWarning, match=r"fc1 \(in\).*zero"):  # fc1's input is data: no input gradient
        grad = transfer(A, A_ft, B, data, mse_loss, method="gradient_only")
    assert only(bico, "fc1.weight") < 1e-6 and only(act, "fc1.weight") > 1e-3
    for tv in (bico, act, grad):
        assert only(tv, "fc3.weight") < 1e-6
    # in_map / out_map overrides reach the fit: BiCo with activation output maps behaves like activation-only
    mixed = transfer(A, A_ft, B, data, mse_loss, out_map="act")
    assert (mixed - act).norm() < 1e-10 * act.norm()


def cnn_truth(tau, M1, M2, M3):
    I3 = torch.eye(3, dtype=DT)
    truth = {}
    for name, Mo, Mi in (("conv1", M1, I3), ("conv2", M2, M1), ("conv3", M3, M2)):
        truth[f"{name}.weight"] = conv_recode(tau[f"{name}.weight"], Mo, Mi)
        truth[f"{name}.bias"] = Mo.T @ tau[f"{name}.bias"]
    truth["fc.weight"], truth["fc.bias"] = tau["fc.weight"] @ M3, tau["fc.bias"]
    return truth


def test_bico_narrower_cnn_gets_the_projection():
    """A = a live CNN embedded with dead channels (and a rotated linear space); B = the live CNN re-coded."""
    g = torch.Generator().manual_seed(11)
    torch.manual_seed(11)
    N = CNN(4, 5, 4).double()
    E = (perm_embed(4, 6, g), ortho(5, 7, g), perm_embed(4, 5, g))
    P = (perm_embed(4, 4, g), ortho(5, 5, g), perm_embed(4, 4, g))
    A, B = recode_cnn(N, *E), recode_cnn(N, *P)
    A_ft = perturb(A, 12)
    sa, sf = A.state_dict(), A_ft.state_dict()
    tau = {k: sf[k] - sa[k] for k in sa}
    truth = cnn_truth(tau, *(e.T @ p for e, p in zip(E, P)))
    tv = transfer(A, A_ft, B, regression_batches(0, 3, n_batches=3, n=16, shape=(16, 3, 8, 8)), mse_loss)
    assert rel_err(tv, truth) < 1e-6
    assert tv.norm() < 0.95 * sum(float(v.pow(2).sum()) for v in tau.values()) ** 0.5  # the dead part is dropped


def test_bico_narrower_transformer_gets_the_projection():
    """A's FFN has dead units (embedded from a live 12-unit FFN); B is the live network re-coded."""
    g = torch.Generator().manual_seed(13)
    torch.manual_seed(13)
    N = TinyTransformer().double()
    to_a = {"res": torch.eye(8, dtype=DT), **{f"{s}{i}": torch.eye(8, dtype=DT) for s in ("qk", "v") for i in range(2)},
            **{f"ff{i}": perm_embed(12, 16, g) for i in range(2)}}
    A = TinyTransformer(ff=16).double()
    A.load_state_dict(recode_transformer_state(N.state_dict(), to_a, 2, 8))
    to_b = transformer_maps(N, 12, g)
    B = TinyTransformer().double()
    B.load_state_dict(recode_transformer_state(N.state_dict(), to_b, 2, 8))
    A_ft = perturb(A, 14)
    sa, sf = A.state_dict(), A_ft.state_dict()
    tau = {k: sf[k] - sa[k] for k in sa}
    truth = recode_transformer_state(tau, {k: to_a[k].T @ to_b[k] for k in to_b}, 2, 8)
    batches = [(torch.randint(0, 20, (8, 6), generator=g), torch.randn(8, 8, generator=g, dtype=DT)) for _ in range(4)]
    tv = transfer(A, A_ft, B, batches, mse_loss)
    assert rel_err(tv, truth) < 1e-6
