"""The calibration plan (pure), the streaming pass against a one-shot computation, and resolve."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ftlab.core.stats import CrossMoments
from ftlab.transfer import TransferOptions, get_method
from ftlab.transfer.align import AffineMoments
from ftlab.transfer.api import pair_points, target_entries
from ftlab.transfer.batches import CalibrationData
from ftlab.transfer.calibrate import affine_maps, collect_map_statistics, resolve, stream
from ftlab.transfer.layer_map import build_layer_map
from ftlab.transfer.plan import aliased, collected, plan_calibration, share_rows
from ftlab.transfer.problem import TransferProblem
from ftlab.transfer.spec import Point, infer_spec

DT = torch.float64
pytestmark = pytest.mark.filterwarnings("ignore::ftlab.transfer.align.RankWarning")

PTS = {"fc": Point("fc", "linear", 4, 6), "bn": Point("bn", "norm2d", 6, 6), "ln": Point("ln", "norm", 6, 6)}
BICO = {"in": ("act",), "out": ("grad", "act")}


def test_plan_lists_requests_fitted_first_and_derives_affine_outputs():
    plan = plan_calibration({"fc": "fc"}, PTS, PTS, {"fc": BICO}, affine={"fc"})
    assert [r.key for r in plan.requests] == [("fc", "in", "act"), ("fc", "out", "grad"), ("fc", "out", "act")]
    assert [r.primary for r in plan.requests] == [True, True, False]
    assert plan.derived == {("fc", "out", "act"): ("fc", "in", "act")}
    assert plan.backward and not plan.input_grads and not plan.second
    # without the affine fact nothing is derived: every statistic is streamed
    assert plan_calibration({"fc": "fc"}, PTS, PTS, {"fc": BICO}).derived == {}


def test_plan_adds_an_internal_input_request_to_derive_a_batchnorm_output():
    plan = plan_calibration({"bn": "bn"}, PTS, PTS, {"bn": {"in": (), "out": ("grad", "act")}}, affine={"bn"})
    internal = [r for r in plan.requests if r.internal]
    assert [r.key for r in internal] == [("bn", "in", "act")]
    assert plan.derived == {("bn", "out", "act"): ("bn", "in", "act")}
    assert ("bn", "in", "act") not in plan.answered()
    # a LayerNorm is not affine in its input: nothing derived, no internal request
    ln = plan_calibration({"ln": "ln"}, PTS, PTS, {"ln": {"in": (), "out": ("grad", "act")}}, affine=set())
    assert not any(r.internal for r in ln.requests) and ln.derived == {}


def test_plan_refuses_an_unknown_statistic_naming_it():
    with pytest.raises(ValueError, match="unknown statistic 'grads' on the out side of 'fc'"):
        plan_calibration({"fc": "fc"}, PTS, PTS, {"fc": {"out": ("grads",)}})
    with pytest.raises(ValueError, match="unknown statistic 'grad' on the in side"):
        plan_calibration({"fc": "fc"}, PTS, PTS, {"fc": {"in": "grad"}})


def test_share_rows_gives_identical_rows_one_owner_fitted_statistics_first():
    pts = {n: Point(n, "linear", 4, 4) for n in ("q", "k")}
    reqs = {"q": {"in": ("act",), "out": ("grad", "act")}, "k": {"in": ("act",), "out": ("grad",)}}
    plan = plan_calibration({"q": "q", "k": "k"}, pts, pts, reqs, affine={"q"})
    same = ("x", "y")  # q's and k's inputs are one tensor in each model
    sig = {("q", "in", "act"): same, ("k", "in", "act"): same, ("q", "out", "grad"): 1, ("k", "out", "grad"): 2,
           ("q", "out", "act"): 3}
    owners = share_rows(plan, sig)
    assert owners[("k", "in", "act")] == ("q", "in", "act") and owners[("q", "in", "act")] == ("q", "in", "act")
    assert set(aliased(owners)) == {("q", "in", "act"), ("k", "in", "act")}
    # derived statistics own no streamed accumulator; a request without rows owns an empty one
    keys = collected(plan, share_rows(plan, {k: v for k, v in sig.items() if k != ("k", "out", "grad")}))
    assert ("q", "out", "act") not in keys and ("k", "out", "grad") in keys
    # the order: a fitted statistic claims shared rows before one read only by the completion rule
    order = plan.sharing_order()
    assert order.index(("q", "in", "act")) < order.index(("q", "out", "act"))


class TwoHeads(nn.Module):
    """One input feeds two linear layers (their input rows are one tensor), then a sum."""

    def __init__(self, d, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.a, self.b = nn.Linear(5, d), nn.Linear(5, d)
        self.out = nn.Linear(d, 2)

    def forward(self, x):
        return self.out(torch.tanh(self.a(x)) + torch.tanh(self.b(x)))


def _problem(A, B):
    sa, sb = infer_spec(A), infer_spec(B)
    lmap = build_layer_map(A, B)
    return TransferProblem(lmap, target_entries(B), sa, sb, pair_points(sa, sb, lmap))


def _ce(m, b):
    return nn.functional.cross_entropy(m(b[0]), b[1])


def _bico_statistics(A, B, data, **options):
    """The statistics BiCo's maps read, streamed over ``data`` with the cross-entropy loss, and the batch count."""
    problem = _problem(A, B)
    bico = get_method("bico")
    reqs = {tp: bico.requirements(problem.target_spec.points[tp]) for tp in problem.pairs}
    return collect_map_statistics(problem, reqs, A, B, CalibrationData(data), _ce, TransferOptions(**options))


# budget 0: every batch whole; 1 byte: pieces of one sample; the default: a first piece of 2 samples, then the rest
@pytest.mark.parametrize("budget", [0, 1, None])
def test_streamed_statistics_equal_a_one_shot_computation_and_shared_rows_share_one_accumulator(budget):
    A, B = TwoHeads(6, 0).double(), TwoHeads(7, 1).double()
    g = torch.Generator().manual_seed(3)
    data = [(torch.randn(9, 5, generator=g, dtype=DT), torch.randint(0, 2, (9,), generator=g)) for _ in range(3)]

    stats, n = _bico_statistics(A, B, data, **({} if budget is None else {"capture_budget": budget}))
    assert n == 3
    X = torch.cat([x for x, _ in data])
    assert torch.allclose(stats[("a", "in", "act")].cross, X.T @ X, rtol=1e-12, atol=1e-12)
    assert stats[("a", "in", "act")] is stats[("b", "in", "act")]  # one accumulator for the shared input rows
    # output activations of a linear layer are derived from its inputs, exactly
    der = stats[("a", "out", "act")]
    assert isinstance(der, AffineMoments)
    ya, yb = A.a(X).detach(), B.a(X).detach()
    assert torch.allclose(der.covariance(), ya.T @ yb, rtol=1e-10, atol=1e-10)
    # output gradients: per-sample gradients of the batch-mean loss, times the batch size (loss_reduction="mean")
    ga = []
    gb = []
    for x, y in data:
        for model, acc in ((A, ga), (B, gb)):
            h = model.a(x).detach().requires_grad_(True)
            out = model.out(torch.tanh(h) + torch.tanh(model.b(x)))
            acc.append(torch.autograd.grad(nn.functional.cross_entropy(out, y), h)[0] * x.shape[0])
    assert torch.allclose(stats[("a", "out", "grad")].cross, torch.cat(ga).T @ torch.cat(gb), rtol=1e-9, atol=1e-12)


def test_stream_and_resolve_by_hand_match_the_convenience_function():
    A, B = TwoHeads(6, 0).double(), TwoHeads(6, 2).double()
    data = [(torch.randn(8, 5, dtype=DT), torch.randint(0, 2, (8,)))]
    problem = _problem(A, B)
    reqs = {tp: {"in": ("act",), "out": ("act",)} for tp in problem.pairs}  # activations only: no loss
    pts_a, pts_b = problem.source_spec.points, problem.target_spec.points
    affine = affine_maps(A, B, problem.pairs, pts_a, pts_b)
    plan = plan_calibration(problem.pairs, pts_a, pts_b, reqs, affine=affine)
    assert not plan.backward
    streamed = stream(plan, A, B, CalibrationData(data), None, TransferOptions())
    stats = resolve(plan, streamed, affine)
    assert set(stats) == set(plan.answered())
    assert all(isinstance(s, (CrossMoments, AffineMoments)) for s in stats.values())
    assert len(streamed.accumulators) == 2  # the shared input of a and b, and the input of out


def test_calibration_data_reads_a_one_shot_iterator_once_and_replays_its_head():
    reads = []

    def gen():
        for i in range(4):
            reads.append(i)
            yield i

    data = CalibrationData(gen())
    assert [a for a, _ in data.head(2)] == [0, 1] and reads == [0, 1]
    assert [a for a, _ in data] == [0, 1, 2, 3] and reads == [0, 1, 2, 3]
    two = CalibrationData(source_batches=[1, 2], target_batches=[3, 4])
    assert list(two) == [(1, 3), (2, 4)] and two.total == 2
    with pytest.raises(ValueError, match="source_batches has 2 batches but target_batches has 3"):
        CalibrationData(source_batches=[1, 2], target_batches=[1, 2, 3])


class ConvNet(nn.Module):
    """Two convolutions (3x3, then 1x1) on images: their rows are strided views of channels-first tensors."""

    def __init__(self, c, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.c1, self.c2 = nn.Conv2d(3, c, 3, padding=1), nn.Conv2d(c, 4, 1)
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        return self.out(torch.tanh(self.c2(torch.tanh(self.c1(x)))).mean((2, 3)))


def test_conv_rows_stream_as_exact_float64_sums_of_the_float32_rows():
    """The strided conv rows of float32 models, cast and laid out in one copy and scaled in place by the batch size:
    the streamed cross-covariances equal float64 products of the rows formed by hand (per position, channels last)."""
    A, B = ConvNet(5, 0), ConvNet(6, 1)
    g = torch.Generator().manual_seed(4)
    data = [(torch.randn(3, 3, 6, 6, generator=g), torch.randint(0, 2, (3,), generator=g)) for _ in range(2)]

    stats, _ = _bico_statistics(A, B, data)

    def by_hand(model):
        act, grad = [], []
        for x, y in data:
            h = model.c1(x).detach().requires_grad_(True)
            out = model.out(torch.tanh(model.c2(torch.tanh(h))).mean((2, 3)))
            gh = torch.autograd.grad(nn.functional.cross_entropy(out, y), h)[0] * x.shape[0]
            cols = nn.functional.unfold(x, 3, padding=1).transpose(1, 2)  # (B, positions, 3 * 3 * 3)
            act.append(cols.reshape(-1, cols.shape[-1]).double())
            grad.append(gh.flatten(2).transpose(1, 2).reshape(-1, gh.shape[1]).double())
        return torch.cat(act), torch.cat(grad)

    (xa, ga), (xb, gb) = by_hand(A), by_hand(B)
    # float64 products of the float32 rows: equal to float64 rounding (the sums are ordered differently)
    torch.testing.assert_close(stats[("c1", "in", "act")].cross, xa.T @ xb, rtol=1e-12, atol=1e-12)
    # gradients times the batch size (ftlab scales the float64 copy, this the float32 rows: equal to float32 rounding)
    torch.testing.assert_close(stats[("c1", "out", "grad")].cross, ga.T @ gb, rtol=1e-6, atol=1e-9)


def _passes(model: nn.Module) -> list[int]:
    """A list that records the number of samples of each forward pass of ``model``."""
    seen: list[int] = []
    model.register_forward_pre_hook(lambda m, args: seen.append(int(args[0].shape[0])))
    return seen


@pytest.mark.parametrize(("budget", "whole", "want"), [
    (0, None, [9, 9]),                  # no budget: every batch whole
    (1, None, [2] + [1] * 16),          # a budget below one sample's captures: pieces of one sample after the first
    (1e12, None, [2, 7, 9]),            # a first piece of 2 samples measures them; then whole batches fit
    (1, "train_mode", [9, 9]),          # train mode (batch statistics couple the samples): whole
    (1, "seq_first", [9, 9]),           # the first axis may be a sequence: whole
])
def test_a_batch_runs_in_pieces_sized_by_the_capture_budget(budget, whole, want):
    A, B = TwoHeads(6, 0).double(), TwoHeads(7, 1).double()
    seen = _passes(A)
    g = torch.Generator().manual_seed(3)
    data = [(torch.randn(9, 5, generator=g, dtype=DT), torch.randint(0, 2, (9,), generator=g)) for _ in range(2)]
    _, n = _bico_statistics(A, B, data, capture_budget=budget, **({whole: True} if whole else {}))
    assert n == 2 and seen == want


def test_pieces_take_the_budget_over_the_bytes_per_sample_spread_evenly():
    from ftlab.transfer.calibrate import _Pieces

    p = _Pieces(1000.0)
    spans = p.spans(25)
    assert next(spans) == (0, 2)
    p.measured(2 * 110, 2)  # 110 bytes per sample: at most 9 samples per piece
    assert list(spans) == [(2, 10), (10, 18), (18, 25)]  # 23 samples in 3 pieces of 8, 8, 7
    assert list(p.spans(9)) == [(0, 9)]
    p.measured(3 * 400, 3)  # the largest bytes per sample seen sizes the pieces: 2 samples each
    assert list(p.spans(5)) == [(0, 2), (2, 4), (4, 5)]
    assert list(_Pieces(None).spans(25)) == [None] and list(_Pieces(10.0).spans(None)) == [None]


def test_batch_slice_cuts_the_per_sample_entries_and_keeps_the_rest():
    import collections

    from ftlab.transfer.batches import batch_slice

    Pair = collections.namedtuple("Pair", "x y")
    x, pos, t = torch.arange(12.0).reshape(4, 3), torch.arange(3).reshape(1, 3), torch.tensor(2.0)
    got = batch_slice({"x": x, "pos": pos, "t": t, "name": "q", "p": Pair(x, [x, 1])}, 1, 3, 4)
    assert torch.equal(got["x"], x[1:3]) and got["x"].data_ptr() == x[1].data_ptr()  # a view
    assert got["pos"] is pos and got["t"] is t and got["name"] == "q"
    assert isinstance(got["p"], Pair) and torch.equal(got["p"].y[0], x[1:3]) and got["p"].y[1] == 1


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), True, "1e8"])
def test_a_bad_capture_budget_is_a_one_line_error_naming_it(bad):
    with pytest.raises(ValueError, match="capture_budget"):
        TransferOptions(capture_budget=bad)
    assert TransferOptions(capture_budget=0).capture_budget is None


class WithToken(nn.Module):
    """A learned token added to every sample: its embedding's output is one row per pass, its gradient the sum over
    the pass (as a ViT's class token or position table)."""

    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.tok, self.fc = nn.Embedding(1, 5), nn.Linear(5, 2)

    def forward(self, x):
        return self.fc(torch.tanh(x + self.tok(torch.zeros(1, dtype=torch.long))))


def test_a_capture_that_is_not_one_per_sample_keeps_batches_whole_and_the_statistics_unchanged():
    A, B = WithToken(0).double(), WithToken(1).double()
    seen = _passes(A.fc)
    g = torch.Generator().manual_seed(3)
    data = [(torch.randn(9, 5, generator=g, dtype=DT), torch.randint(0, 2, (9,), generator=g)) for _ in range(2)]
    whole, _ = _bico_statistics(A, B, data, capture_budget=0)
    seen.clear()
    split, _ = _bico_statistics(A, B, data, capture_budget=1)
    assert seen == [2, 9, 9]  # the probe of 2 samples is dropped; every batch runs whole
    seen.clear()
    one = [(data[0][0][:1], data[0][1][:1])] + data  # a first batch of 1 sample tells nothing: the next one probes
    _bico_statistics(A, B, one, capture_budget=1)
    assert seen == [1, 2, 9, 9]
    for key, st in whole.items():
        if isinstance(st, CrossMoments):
            assert torch.equal(split[key].cross, st.cross), key
