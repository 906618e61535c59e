"""Task vectors, Procrustes maps, token alignment, depth maps, specs, methods and the alpha search."""

from __future__ import annotations

import copy
import itertools
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from ftlab.core.stats import CrossMoments
from ftlab.transfer import TaskVector, TransferOptions, fit_transfer, infer_spec, list_methods, search_alpha, transfer
from ftlab.transfer.align import RankWarning, align_tokens, fit_map, naive_map, procrustes
from ftlab.transfer.layer_map import LayerMap, build_layer_map, depth_map, find_stacks, monotone_assignment
from ftlab.transfer.spec import Rule
from ftlab.transfer.transport import pad_truncate, transport
from transfer_helpers import perturbed

torch.set_num_threads(1)
DT = torch.float64
pytestmark = pytest.mark.filterwarnings("ignore::ftlab.transfer.align.RankWarning")


def mlp(seed=0, h=6):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, h), nn.Tanh(), nn.Linear(h, 3)).double()


def shifted(model, seed, scale=0.1):
    return perturbed(model, seed, scale)


def batches(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(32, 4, generator=g, dtype=DT), torch.randn(32, 3, generator=g, dtype=DT)) for _ in range(n)]


def loss(model, batch):
    x, y = batch
    return (model(x) - y).pow(2).sum()


# -- task vectors -------------------------------------------------------------------------------

def test_task_vector_arithmetic_and_apply():
    base, ft = mlp(0), shifted(mlp(0), 1)
    tv = TaskVector.from_models(base, ft)
    assert torch.equal(tv["0.weight"], ft[0].weight.detach() - base[0].weight.detach())
    assert (tv + tv - tv).norm() == pytest.approx(tv.norm(), rel=1e-12)
    assert (-2.5 * tv).norm() == pytest.approx(2.5 * tv.norm(), rel=1e-12)
    assert (tv * 0).norm() == 0
    # apply returns a copy: theta_pre + alpha tau; the base is untouched
    before = copy.deepcopy(base.state_dict())
    m = tv.apply(base, alpha=1.0)
    torch.testing.assert_close(m.state_dict()["2.bias"], ft.state_dict()["2.bias"])
    assert all(torch.equal(before[k], v) for k, v in base.state_dict().items())
    half = tv.apply(base, alpha=0.5)
    torch.testing.assert_close(half[0].weight, base[0].weight + 0.5 * tv["0.weight"])
    assert tv.apply_(base, 1.0) is base  # in place, by name
    # a tied weight listed under two names gets its delta once
    tied = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 5, bias=False))
    tied[1].weight = tied[0].weight
    before = tied[0].weight.detach().clone()
    delta = torch.ones(5, 3)
    TaskVector({"0.weight": delta, "1.weight": delta}).apply_(tied)
    torch.testing.assert_close(tied[0].weight.detach(), before + delta)
    with pytest.raises(ValueError, match="tied"):
        TaskVector({"0.weight": delta, "1.weight": 2 * delta}).apply_(tied)
    torch.testing.assert_close(base[0].weight, ft[0].weight)


def test_task_vector_strictness_and_lenient_mode(tmp_path):
    from safetensors.torch import save_file

    a, b = mlp(0), mlp(0, h=7)
    with pytest.raises(ValueError, match="shape mismatch"):
        TaskVector.from_models(a, b)
    assert len(TaskVector.from_models(a, b, lenient=True)) == 1  # only 2.bias keeps its shape
    tv = TaskVector.from_models(a, shifted(a, 2))
    with pytest.raises(ValueError, match="lenient=True"):
        tv.apply(b)
    before = b[2].bias.detach().clone()
    tv.apply_(b, 1.0, lenient=True)
    torch.testing.assert_close(b[2].bias, before + tv["2.bias"])
    with pytest.raises(ValueError, match="different keys"):
        tv + TaskVector({"x": torch.zeros(1)})
    # safetensors round trip agrees with the in-memory construction
    save_file({k: v.contiguous() for k, v in a.state_dict().items()}, str(tmp_path / "pre.safetensors"))
    save_file({k: v.contiguous() for k, v in shifted(a, 2).state_dict().items()}, str(tmp_path / "ft.safetensors"))
    tv2 = TaskVector.from_safetensors(tmp_path / "pre.safetensors", tmp_path / "ft.safetensors")
    assert (tv2 - tv).norm() == 0.0


# -- Procrustes and alignment -------------------------------------------------------------------

@pytest.mark.parametrize("da,db", [(6, 6), (4, 7), (7, 4)])
def test_procrustes_is_optimal_and_semi_orthogonal(da, db):
    g = torch.Generator().manual_seed(da * 10 + db)
    X = torch.randn(50, da, generator=g, dtype=DT)
    Y = torch.randn(50, db, generator=g, dtype=DT)
    R = procrustes(X.T @ Y)
    k = min(da, db)
    gram = R @ R.T if da <= db else R.T @ R
    torch.testing.assert_close(gram, torch.eye(k, dtype=DT))
    best = torch.linalg.norm(X @ R - Y)
    for _ in range(20):
        Q = torch.linalg.qr(torch.randn(max(da, db), k, generator=g, dtype=DT))[0]
        Q = Q.T if da <= db else Q
        assert best <= torch.linalg.norm(X @ Q - Y) + 1e-12


def test_fit_map_recovers_rotation_with_whitening_and_centering():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(300, 5, generator=g, dtype=DT) @ torch.diag(torch.tensor([3.0, 2, 1, 0.5, 0.2], dtype=DT))
    Q = torch.linalg.qr(torch.randn(5, 5, generator=g, dtype=DT))[0]
    for p in (0.0, 0.25, 0.5):
        st = CrossMoments(5, 5, second=True).update(X, X @ Q)
        torch.testing.assert_close(fit_map(st, source="act", whiten_p=p).R, Q)
    # offsets on both sides (B's not the rotated A's) break the uncentred fit but not the centred one
    off_a, off_b = torch.randn(2, 1, 5, generator=g, dtype=DT) * 3
    Xc = X - X.mean(0)
    st = CrossMoments(5, 5, second=True).update(Xc + off_a, Xc @ Q + off_b)
    torch.testing.assert_close(fit_map(st, source="act", center=True).R, Q)
    assert torch.linalg.norm(fit_map(st, source="act").R - Q) > 1e-3
    with pytest.raises(ValueError, match="whiten_p"):
        fit_map(st, source="act", whiten_p=0.7)


def test_a_fit_notes_when_rows_are_fewer_than_width_and_a_transfer_warns_once():
    X = torch.randn(3, 8, dtype=DT)
    assert "3 rows" in fit_map(CrossMoments(8, 8).update(X, X), source="act", name="p").note
    fit = fit_map(CrossMoments(8, 6).update(X, torch.zeros(3, 6, dtype=DT)), source="grad")
    assert "zero" in fit.note and not fit.converged and torch.equal(fit.R, naive_map(8, 6))
    full = fit_map(CrossMoments(8, 8).update(torch.randn(30, 8, dtype=DT), torch.randn(30, 8, dtype=DT)), source="act")
    assert full.note is None
    # one transfer with several under-determined maps: one warning that counts them and names the least determined
    A, A_ft = mlp(0, h=40), shifted(mlp(0, h=40), 1)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        res = fit_transfer(A, A_ft, mlp(2, h=40), batches(n=1), loss)
    ranked = [r for r in rec if issubclass(r.category, RankWarning)]
    notes = [f.note for pair in res.fits.values() for f in pair if f is not None and f.note]
    assert len(ranked) == 1 and len(notes) >= 2
    assert f"{len(notes)} of " in str(ranked[0].message) and "rank" in str(ranked[0].message)


def test_token_alignment_modes():
    B = 2
    pos = torch.linspace(0, 1, 9, dtype=DT)
    a = (pos[None, :, None] * torch.tensor([1.0, -2.0], dtype=DT)).expand(B, 9, 2)  # linear in position
    b = torch.zeros(B, 5, 3, dtype=DT)
    ra, rb = align_tokens(a, b, "interpolate")
    expect = torch.linspace(0, 1, 5, dtype=DT)[:, None] * torch.tensor([1.0, -2.0], dtype=DT)
    torch.testing.assert_close(ra[:5], expect)
    # 2-D: a bilinear function on a 4x4 grid (+1 CLS token) resampled to 3x3 stays exact
    yy, xx = torch.meshgrid(torch.linspace(0, 1, 4, dtype=DT), torch.linspace(0, 1, 4, dtype=DT), indexing="ij")
    grid = (2 * yy + 3 * xx).reshape(1, 16, 1)
    a2 = torch.cat([torch.full((1, 1, 1), 7.0, dtype=DT), grid], 1)
    ra, rb = align_tokens(a2, torch.zeros(1, 10, 4, dtype=DT), "interpolate2d")
    y3, x3 = torch.meshgrid(torch.linspace(0, 1, 3, dtype=DT), torch.linspace(0, 1, 3, dtype=DT), indexing="ij")
    assert ra[0, 0] == 7.0 and rb.shape == (10, 4)
    torch.testing.assert_close(ra[1:, 0], (2 * y3 + 3 * x3).reshape(-1))
    # identity with a padding mask keeps exactly the real tokens; mean respects the mask
    a3 = torch.arange(2 * 4 * 2, dtype=DT).reshape(2, 4, 2)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    ra, rb = align_tokens(a3, a3 + 1, "identity", mask_a=mask, mask_b=mask)
    assert ra.shape == (6, 2) and torch.equal(rb - ra, torch.ones(6, 2, dtype=DT))
    ra, _ = align_tokens(a3, a3, "mean", mask_a=mask, mask_b=mask)
    torch.testing.assert_close(ra[0], a3[0, :2].mean(0))
    with pytest.raises(ValueError, match="equal token counts"):
        align_tokens(a3, b, "identity")


# -- depth maps ---------------------------------------------------------------------------------

@pytest.mark.parametrize("rule", ["nearest_relative", "proportional", "prefix"])
def test_depth_maps_cover_every_target_layer_in_order(rule):
    for la, lb in itertools.product(range(1, 13), range(1, 25)):
        m = depth_map(la, lb, rule)
        assert len(m) == lb
        src = [i for i in m if i is not None]
        assert all(0 <= i < la for i in src)
        assert src == sorted(src)
        if rule != "prefix":
            assert None not in m and (m[0] == 0 or lb == 1)
        if rule == "nearest_relative" and lb > 1:
            assert m[-1] == la - 1
            # each i(j) is (one of) the nearest source layers in relative depth
            for j, i in enumerate(m):
                x = j * (la - 1) / (lb - 1)
                assert abs(i - x) <= 0.5 + 1e-12
        if la == lb:
            assert m == list(range(la))


def test_monotone_assignment_matches_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(30):
        nb, na = rng.integers(1, 5), rng.integers(1, 5)
        S = rng.normal(size=(nb, na))
        best = max((c for c in itertools.product(range(na), repeat=nb) if list(c) == sorted(c)),
                   key=lambda c: sum(S[j, i] for j, i in enumerate(c)))
        got = monotone_assignment(S)
        assert got == sorted(got)
        assert sum(S[j, i] for j, i in enumerate(got)) == pytest.approx(sum(S[j, i] for j, i in enumerate(best)))


class Stacked(nn.Module):
    def __init__(self, depth, d=6, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.inp = nn.Linear(4, d)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(d, d), nn.Tanh()) for _ in range(depth))
        self.out = nn.Linear(d, 3)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = h + b(h)
        return self.out(h)


def test_layer_map_names_and_cka_rule():
    A, B = Stacked(2).double(), Stacked(4, seed=1).double()
    assert {k: s.depth for k, s in find_stacks(B).items()} == {"blocks": 4}
    lm = build_layer_map(A, B)
    assert lm.as_dict() == {"blocks": [0, 0, 1, 1]}
    assert lm.source_name("blocks.3.0.weight") == "blocks.1.0.weight"
    assert lm.source_name("out.bias") == "out.bias"
    assert LayerMap({"blocks": [0, None]}).source_name("blocks.1.0.bias") is None
    # CKA rule: a target whose blocks are the source's own blocks maps each block to itself
    A4 = Stacked(4, seed=2).double()
    res = fit_transfer(A4, shifted(A4, 3), copy.deepcopy(A4), batches(), loss, options=TransferOptions(depth_map="cka"))
    assert res.layer_map == {"blocks": [0, 1, 2, 3]}


def test_depth_transfer_copies_the_mapped_source_block():
    """With identical widths, identity transport + depth map: target block j gets tau of source block i(j)."""
    A, B = Stacked(2).double(), Stacked(3, seed=1).double()
    A_ft = shifted(A, 4)
    tau = TaskVector.from_models(A, A_ft)
    for method, dm, expect in (("naive", "nearest_relative", [0, 1, 1]), ("naive", "prefix", [0, 1, None])):
        tv = transfer(A, A_ft, B, method=method, depth_map=dm, copies="sum")
        for j, i in enumerate(expect):
            got = tv[f"blocks.{j}.0.weight"]
            assert torch.equal(got, tau[f"blocks.{i}.0.weight"]) if i is not None else float(got.abs().max()) == 0



def test_a_one_block_stack_pairs_with_a_deeper_stack_in_both_directions():
    """A one-layer model's ``blocks`` (a ModuleList of one block) is a stack of depth 1 where the other model has a
    deeper stack: the target's blocks all draw from the only source block; a one-block target takes the source block
    the rule names (nearest_relative: the last). A wrapper around a stack is not a one-block stack."""
    one, three = Stacked(1).double(), Stacked(3, seed=1).double()
    lm = build_layer_map(one, three)
    assert lm.as_dict() == {"blocks": [0, 0, 0]}
    assert lm.source_name("blocks.2.0.weight") == "blocks.0.0.weight"
    assert build_layer_map(three, one).as_dict() == {"blocks": [2]}
    assert build_layer_map(three, one, "prefix").as_dict() == {"blocks": [0]}
    A_ft = shifted(one, 4)
    tau = TaskVector.from_models(one, A_ft)
    tv = transfer(one, A_ft, three, method="naive", depth_map="nearest_relative", copies="sum")
    for j in range(3):
        assert torch.equal(tv[f"blocks.{j}.0.weight"], tau["blocks.0.0.weight"])
    B_ft = shifted(three, 5)
    tau_b = TaskVector.from_models(three, B_ft)
    back = transfer(three, B_ft, one, method="naive", depth_map="nearest_relative")
    assert torch.equal(back["blocks.0.0.weight"], tau_b["blocks.2.0.weight"])
    wrapped = nn.Sequential(Stacked(3, seed=2).double())
    assert build_layer_map(wrapped, wrapped).as_dict() == {"0.blocks": [0, 1, 2]}

# -- specs --------------------------------------------------------------------------------------

class Scale(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * self.gain


def test_spec_inference_and_unknown_modules():
    spec = infer_spec(nn.TransformerEncoderLayer(8, 2, 16))
    assert [r.point for r in spec.rules["self_attn.in_proj_weight"]] == ["self_attn.q", "self_attn.k", "self_attn.v"]
    assert spec.rules["norm1.weight"][0].kind == "out_vector"
    conv = infer_spec(nn.Conv2d(3, 4, 3))
    assert (conv.points[""].in_dim, conv.points[""].out_dim) == (27, 4)
    grouped = infer_spec(nn.Conv2d(3, 6, 3, groups=3))  # depth multiplier 2: a grouped conv, dense unfolded inputs
    assert (grouped.points[""].kind, grouped.points[""].in_dim, grouped.points[""].groups) == ("conv2d", 27, 3)
    dw = infer_spec(nn.Conv2d(4, 4, 3, groups=4))  # depthwise: one channel space on both sides
    assert (dw.points[""].kind, dw.points[""].in_dim, dw.points[""].out_dim) == ("depthwise", 4, 4)
    assert dw.rules["weight"][0].kind == "diagonal"
    odd = nn.Sequential(nn.Linear(4, 6), Scale(6), nn.Linear(6, 3))
    with pytest.raises(ValueError, match=r"'1' \(Scale\)"):
        infer_spec(odd)
    # a hand-written rule: the gain lives in the output space of the linear layer before it
    spec = infer_spec(odd, overrides={"1.gain": [Rule("1.gain", "out_vector", "0")]})
    assert spec.rules["1.gain"][0].point == "0"
    with pytest.raises(ValueError, match="unknown point"):
        infer_spec(odd, overrides={"1.gain": [Rule("1.gain", "out_vector", "nope")]})


# -- methods ------------------------------------------------------------------------------------

def test_registry_entries():
    names = {m.name: m for m in list_methods()}
    assert set(names) >= {"bico", "activation_only", "gradient_only", "naive", "identity", "gradfix"}
    assert "2605.28444" in names["bico"].reference and "2510.09658" in names["gradfix"].reference
    assert all(m.human_name and m.description for m in names.values())


def test_identity_maps_return_the_task_vector_unchanged():
    A = mlp(0)
    A_ft = shifted(A, 1)
    tau = TaskVector.from_models(A, A_ft)
    assert (transfer(A, A_ft, mlp(5), method="identity") - tau).norm() == 0
    # transport with identity maps is the identity
    spec = infer_spec(A)
    maps = {p: (torch.eye(pt.in_dim, dtype=DT), torch.eye(pt.out_dim, dtype=DT)) for p, pt in spec.points.items()}
    out = transport(tau, target_spec=spec, target_shapes={k: v.shape for k, v in A.named_parameters()},
                    layer_map=LayerMap({}), maps=maps)
    assert (out - tau).norm() < 1e-15
    # BiCo between a model and itself fits identity maps, so tau comes back unchanged
    assert (transfer(A, A_ft, copy.deepcopy(A), batches(), loss) - tau).norm() < 1e-10 * tau.norm()
    with pytest.raises(ValueError, match="equal shapes"):
        transfer(A, A_ft, mlp(0, h=7), method="identity")


def test_naive_pads_and_truncates_the_leading_block():
    A, A_ft = mlp(0), shifted(mlp(0), 1)
    tau = TaskVector.from_models(A, A_ft)
    wide = transfer(A, A_ft, mlp(0, h=9), method="naive")
    assert torch.equal(wide["0.weight"][:6], tau["0.weight"]) and float(wide["0.weight"][6:].abs().max()) == 0
    narrow = transfer(A, A_ft, mlp(0, h=4), method="naive")
    assert torch.equal(narrow["2.weight"], tau["2.weight"][:, :4])
    zero = transfer(A, A_ft, mlp(0, h=4), method="naive", naive_mode="zero")
    assert float(zero["0.weight"].abs().max()) == 0 and torch.equal(zero["2.bias"], tau["2.bias"])
    assert torch.equal(pad_truncate(torch.ones(2, 3), (3, 2)), torch.tensor([[1.0, 1], [1, 1], [0, 0]]))


@pytest.mark.parametrize("vote", ["mean", "max"])
def test_gradfix_keeps_only_descent_coordinates(vote):
    A, A_ft, B = mlp(0), shifted(mlp(0), 1), mlp(3)
    data = batches()
    tv = transfer(A, A_ft, B, data, loss, method="gradfix", vote=vote)
    tau = TaskVector.from_models(A, A_ft)
    B.zero_grad()
    for b in data:
        loss(B, b).backward()
    kept, inner = 0, 0.0
    for name, p in B.named_parameters():
        t = tv[name]
        nz = t != 0
        assert torch.equal(t[nz], tau[name][nz])  # GradFix masks, it does not rescale
        if vote == "mean":
            assert float((t * p.grad).max()) <= 0.0  # each kept coordinate descends the target loss
        inner += float((t * p.grad).sum())
        kept += int(nz.sum())
    assert 0 < kept < tau.numel()
    if vote == "mean":
        assert inner < 0.0  # a first-order descent direction for the target loss


def test_bad_inputs_are_value_errors_and_misuse_is_a_type_error():
    A, A_ft = mlp(0), shifted(mlp(0), 1)
    with pytest.raises(ValueError, match="method='nope'"):
        transfer(A, A_ft, mlp(2), batches(), loss, method="nope")
    with pytest.raises(ValueError, match="invalid option"):
        transfer(A, A_ft, mlp(2), batches(), loss, method="naive", whiten_p=0.1)
    with pytest.raises(TypeError, match="loss"):
        transfer(A, A_ft, mlp(2), batches(), lambda m: 0.0)
    with pytest.raises(TypeError, match="loss"):
        transfer(A, A_ft, mlp(2), batches(), "mse")
    with pytest.raises(TypeError, match="target_base must be a torch.nn.Module"):
        transfer(A, A_ft, {"w": 1}, batches(), loss)
    with pytest.raises(ValueError, match="depth_map"):
        transfer(A, A_ft, mlp(2), batches(), loss, depth_map="diagonal")
    with pytest.raises(ValueError, match="no batches"):
        transfer(A, A_ft, mlp(2), [], loss)


def test_models_are_restored_after_a_failing_loss():
    from ftlab.core.hooks import hook_count

    A, A_ft, B = mlp(0), shifted(mlp(0), 1), mlp(2)
    B.train()
    B[0].weight.requires_grad_(False)

    def bad_loss(model, batch):
        if model is B:
            raise RuntimeError("boom")
        return loss(model, batch)

    with pytest.raises(ValueError, match="target model, first calibration batch: RuntimeError: boom"):  # named
        transfer(A, A_ft, B, batches(), bad_loss)
    assert hook_count(A) == hook_count(B) == 0
    assert B.training and not B[0].weight.requires_grad and B[0].bias.requires_grad


def test_one_shot_iterators_and_separate_batches_work():
    A, A_ft = mlp(0), shifted(mlp(0), 1)
    B = copy.deepcopy(A)
    data = batches()
    ref = transfer(A, A_ft, B, data, loss)
    assert (transfer(A, A_ft, B, iter(data), loss) - ref).norm() == 0
    assert (transfer(A, A_ft, B, source_batches=data, target_batches=list(data), loss=loss) - ref).norm() == 0


# -- alpha search -------------------------------------------------------------------------------

def test_search_alpha_finds_the_planted_optimum():
    best, table = search_alpha(lambda a: -(a - 1.3) ** 2)
    assert best == pytest.approx(1.3) and table["best"].sum() == 1 and not table.attrs["at_edge"]
    assert {0.0, 1.0} <= set(np.round(table["alpha"], 10))  # the untouched target and alpha = 1 are always scored
    best, table = search_alpha(lambda a: -a)  # a transfer that only hurts: the search declines it
    assert best == 0.0 and table.attrs["at_edge"]
    best, _ = search_alpha(lambda a: 1.0, grid=[0.5, 0.2, 2.0])
    assert best == 0.2  # ties -> smallest alpha
    best, _ = search_alpha(lambda a: (a - 0.4) ** 2, grid=[0.1, 0.4, 0.9], higher_is_better=False)
    assert best == 0.4
    with pytest.raises(ValueError, match="not finite"):
        search_alpha(lambda a: float("nan"), grid=[1.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="empty"):
            search_alpha(lambda a: 0.0, grid=[])


def test_source_statistics_at_base_or_finetuned_weights():
    """With source_stats='finetuned', A's rows come from A_ft: transferring A_ft onto a copy of A_ft is the identity."""
    A = mlp(0)
    A_ft = shifted(A, 1, scale=0.5)
    tau = TaskVector.from_models(A, A_ft)
    same = transfer(A, A_ft, copy.deepcopy(A_ft), batches(), loss, source_stats="finetuned")
    assert (same - tau).norm() < 1e-10 * tau.norm()
    assert (transfer(A, A_ft, copy.deepcopy(A_ft), batches(), loss) - tau).norm() > 1e-3 * tau.norm()
    with pytest.raises(ValueError, match="source_stats"):
        transfer(A, A_ft, A, batches(), loss, source_stats="both")


def test_reported_rank_never_exceeds_the_calibration_rows():
    # float32 batch products leave rounding noise in the float64 sums; the reported rank must still be <= n rows

    from ftlab.core.stats import CrossMoments
    from ftlab.transfer.align import fit_map

    g = torch.Generator().manual_seed(0)
    stats = CrossMoments(64, 96)
    for _ in range(3):
        stats.update(torch.randn(7, 64, generator=g), torch.randn(7, 96, generator=g))
    fit = fit_map(stats, source="act", name="layer")
    assert fit.rank == 21 and stats.n == 21
    # float32 rows: the rank is judged at float32 precision, and the note says so
    assert "21 rows (rank 21 of 64 at float32 precision)" in fit.note


def _batching_pair():
    g = torch.Generator().manual_seed(7)
    a = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()
    b = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3)).double()
    a_ft = copy.deepcopy(a)
    with torch.no_grad():
        for p in list(a.parameters()) + list(b.parameters()):
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
        a_ft.load_state_dict(a.state_dict())
        for p in a_ft.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    x = torch.randn(100, 6, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (100,), generator=g)
    return a, a_ft, b, x, y


def _mean_ce(model, batch):
    return torch.nn.functional.cross_entropy(model(batch[0]), batch[1])


def test_gradient_maps_do_not_depend_on_how_samples_are_batched():
    """A mean loss scales each sample's gradient by 1/batch size; with the default
    loss_reduction="mean" a short last batch (4 of 100 samples) must not outweigh the others.
    (BiCo's maps are full rank here; gradient-only's input map is rank 2 and partly arbitrary.)"""
    a, a_ft, b, x, y = _batching_pair()
    one = [(x, y)]
    split = [(x[i:i + 32], y[i:i + 32]) for i in range(0, 100, 32)]  # 32, 32, 32, 4
    t_one = transfer(a, a_ft, b, one, _mean_ce, method="bico")
    t_split = transfer(a, a_ft, b, split, _mean_ce, method="bico")
    for k in t_one:
        torch.testing.assert_close(t_split[k], t_one[k], rtol=1e-7, atol=1e-10)
    # without the correction the two batchings give different maps (the check above can fail)
    raw_one = transfer(a, a_ft, b, one, _mean_ce, method="bico", loss_reduction="sum")
    raw_split = transfer(a, a_ft, b, split, _mean_ce, method="bico", loss_reduction="sum")
    assert max(float((raw_split[k] - raw_one[k]).abs().max()) for k in raw_one) > 1e-3


def test_loss_reduction_is_checked():
    a, a_ft, b, x, y = _batching_pair()
    with pytest.raises(ValueError, match="loss_reduction"):
        transfer(a, a_ft, b, [(x, y)], _mean_ce, loss_reduction="avg")
