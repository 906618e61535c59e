"""The factored solver against the dense one, kept rows against streamed sums, and transfers that use them."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from ftlab.core.stats import CrossMoments, RowMoments
from ftlab.transfer import TaskVector, TransferOptions, fit_transfer, transfer
from ftlab.transfer.align import AffineMoments, SumMoments, fit_map
from ftlab.transfer.factored import LowRankMap, as_dense

DT = torch.float64
pytestmark = pytest.mark.filterwarnings("ignore::ftlab.transfer.align.RankWarning")


def rows(n, d_a, d_b, seed, *, rank=None, tie=False, zero=False, singular=0):
    """A RowMoments of ``n`` row pairs: B's rows a fixed linear image of A's, of the given rank; ``tie``: equal
    singular values; ``zero``: all rows zero; ``singular=m``: the pad/truncate step is singular on ``m`` directions
    (A's rows avoid the first ``m`` coordinates, B's rows span them: N sends those undetermined directions of A
    into B's determined subspace; ``-m``: the same with A and B swapped)."""
    g = torch.Generator().manual_seed(seed)
    r = rank or n
    Z = torch.randn(n, r, generator=g, dtype=DT)
    if tie:
        Z = torch.linalg.qr(Z)[0] * 3.0  # orthonormal columns, all scaled alike: every singular value ties
    A = Z @ torch.randn(r, d_a, generator=g, dtype=DT)
    B = Z @ torch.randn(r, d_b, generator=g, dtype=DT) + 0.1 * torch.randn(n, d_b, generator=g, dtype=DT)
    if tie:
        A = Z @ torch.linalg.qr(torch.randn(d_a, r, generator=g, dtype=DT))[0].T
        B = Z @ torch.linalg.qr(torch.randn(d_b, r, generator=g, dtype=DT))[0].T
    if singular:
        m = abs(singular)
        P_avoid = torch.randn(r, max(d_a, d_b), generator=g, dtype=DT)
        P_avoid[:, :m] = 0  # rows orthogonal to the first m coordinates
        P_span = torch.randn(r, max(d_a, d_b), generator=g, dtype=DT)
        P_span[:m] = 0
        P_span[:m, :m] = torch.eye(m, dtype=DT)  # the first m coordinates lie in the rows' span
        A, B = (Z @ P_avoid[:, :d_a], Z @ P_span[:, :d_b]) if singular > 0 else (Z @ P_span[:, :d_a], Z @ P_avoid[:, :d_b])
    if zero:
        A, B = A * 0, B * 0
    st_ = RowMoments(d_a, d_b)
    for i in range(0, n, 7):
        st_.update(A[i:i + 7], B[i:i + 7])
    return st_


def both(stats, chain, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fit_map(stats, source="x", completion=chain, solver="factored", **kw), \
            fit_map(stats, source="x", completion=chain, solver="dense", **kw)


def _carried(R, tau):
    """``R^T tau R`` for a square task-vector block ``tau`` (``d_A x d_A``)."""
    D = as_dense(R)
    return D.T @ tau @ D


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), d_a=st.integers(20, 60), d_b=st.integers(20, 60), n=st.integers(1, 15),
       n2=st.integers(0, 15), center=st.booleans(), kind=st.sampled_from(["random", "tie", "zero", "low"]))
def test_factored_and_dense_solves_agree_on_random_low_rank_statistics(seed, d_a, d_b, n, n2, center, kind):
    primary = rows(n, d_a, d_b, seed, tie=kind == "tie", zero=kind == "zero", rank=max(1, n // 2) if kind == "low" else None)
    chain = [("naive", None)] if n2 == 0 else [("act", rows(n2, d_a, d_b, seed + 1)), ("naive", None)]
    fac, den = both(primary, chain, center=center)
    assert isinstance(den.R, torch.Tensor)  # the factored map is low-rank or, where that is no smaller, dense
    assert (fac.rank, fac.dims, fac.completed) == (den.rank, den.dims, den.completed)
    torch.testing.assert_close(as_dense(fac.R), den.R, atol=1e-8, rtol=0)
    R = den.R  # a (semi-)orthogonal map either way
    k = min(d_a, d_b)
    gram = R @ R.T if d_a <= d_b else R.T @ R
    torch.testing.assert_close(gram, torch.eye(k, dtype=DT), atol=1e-8, rtol=0)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), d_a=st.integers(12, 50), d_b=st.integers(12, 50), n=st.integers(4, 12),
       m=st.integers(1, 3), n2=st.integers(0, 8), center=st.booleans(), flip=st.booleans())
def test_one_completion_on_singular_pad_truncate_steps(seed, d_a, d_b, n, m, n2, center, flip):
    """Where the pad/truncate step is singular (undetermined directions of one side that N sends entirely into the
    other side's determined subspace) the rule leaves them unmapped; both solvers give the same map, the same task
    vector (1e-9 relative) and the same record, and the dense map does not depend on the SVD's bases."""
    rank = n - 1
    primary = rows(n, d_a, d_b, seed, rank=rank, singular=-m if flip else m)
    chain = [("naive", None)] if n2 == 0 else [("act", rows(n2, d_a, d_b, seed + 1)), ("naive", None)]
    fac, den = both(primary, chain, center=center)
    assert (fac.rank, fac.dims, fac.completed) == (den.rank, den.dims, den.completed)
    tau = torch.randn(d_a, d_a, generator=torch.Generator().manual_seed(seed), dtype=DT)
    want = _carried(den.R, tau)
    assert float(torch.linalg.norm(_carried(fac.R, tau) - want)) <= 1e-9 * float(torch.linalg.norm(want))
    # a partial isometry: R R^T (or R^T R) is the projector onto the mapped directions, of rank dims - unmapped
    unmapped = sum(d for label, d in den.completed if label == "unmapped")
    R = den.R
    gram = R @ R.T if d_a <= d_b else R.T @ R
    torch.testing.assert_close(gram @ gram, gram, atol=1e-9, rtol=0)
    assert round(float(torch.trace(gram))) == min(d_a, d_b) - unmapped
    if n2 == 0 and not center and rank + m <= min(d_a, d_b):
        # the construction puts m undetermined directions of one side in the kernel of the pad/truncate step (when the
        # rows' rank fits beside those m coordinates: otherwise the avoiding side loses rank and the count differs);
        # only as many of them stay undecided as the wider side's spare directions cannot absorb
        want_unmapped = min(d_a, d_b) - (min(d_a, d_b - m) if flip else min(d_a - m, d_b))
        assert unmapped == want_unmapped
        assert ("left unmapped" in den.note) == (want_unmapped > 0)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10**6), d_a=st.integers(12, 40), d_b=st.integers(12, 40), m=st.integers(1, 3))
def test_the_completed_map_does_not_depend_on_the_bases_of_the_undetermined_subspaces(seed, d_a, d_b, m):
    """The completion of the undetermined subspaces spanned by ``Up``, ``Vp`` is the same for any other orthonormal
    bases ``Up Q_1``, ``Vp Q_2`` of them: the rule has one answer (the SVD's arbitrary pairing had not)."""
    from ftlab.transfer.align import _complete

    C = rows(8, d_a, d_b, seed, rank=6, singular=m).covariance()
    U, s, Vh = torch.linalg.svd(C, full_matrices=True)
    r = int((s > 1e-8 * s[0]).sum())
    Up, Vp = U[:, r:], Vh[r:].T
    g = torch.Generator().manual_seed(seed + 7)
    Q1 = torch.linalg.qr(torch.randn(Up.shape[1], Up.shape[1], generator=g, dtype=DT))[0]
    Q2 = torch.linalg.qr(torch.randn(Vp.shape[1], Vp.shape[1], generator=g, dtype=DT))[0]
    chain = [("naive", None)]
    R1, used1 = _complete(Up, Vp, chain, center=False, da=d_a, db=d_b, rank_rtol=None)
    R2, used2 = _complete(Up @ Q1, Vp @ Q2, chain, center=False, da=d_a, db=d_b, rank_rtol=None)
    unmapped = min(d_a, d_b) - min(d_a - m, d_b)  # the m directions the step cannot decide, less the spare ones
    assert used1 == used2 and (("unmapped", unmapped) in used1) == (unmapped > 0)
    torch.testing.assert_close(R1, R2, atol=1e-10, rtol=0)


def test_a_zero_statistic_gives_the_pad_truncate_map_exactly_on_both_paths():
    fac, den = both(rows(5, 30, 40, 0, zero=True), [("naive", None)])
    assert torch.equal(as_dense(fac.R), torch.eye(30, 40, dtype=DT)) and torch.equal(den.R, torch.eye(30, 40, dtype=DT))
    assert not fac.converged and not den.converged


def test_derived_and_summed_statistics_factor_like_their_dense_forms():
    base = rows(9, 30, 34, 3)
    g = torch.Generator().manual_seed(4)
    aff = AffineMoments(base, (torch.randn(50, 30, generator=g, dtype=DT), torch.randn(50, generator=g, dtype=DT)),
                        (torch.randn(45, 34, generator=g, dtype=DT), None))
    summed = SumMoments([rows(6, 30, 34, 5), rows(4, 30, 34, 6)])
    for stats in (aff, summed):
        for center in (False, True):
            F_A, F_B = stats.factors(center=center)
            torch.testing.assert_close(F_A.T @ F_B, stats.covariance(center=center), atol=1e-9, rtol=1e-9)
        fac, den = both(stats, [("naive", None)])
        torch.testing.assert_close(as_dense(fac.R), den.R, atol=1e-8, rtol=0)


def test_low_rank_maps_apply_like_their_dense_matrices():
    g = torch.Generator().manual_seed(0)
    for d_a, d_b in ((12, 20), (20, 12), (15, 15)):
        M = LowRankMap(torch.randn(d_a, 4, generator=g, dtype=DT), torch.randn(d_b, 4, generator=g, dtype=DT))
        D = M.dense()
        X = torch.randn(3, d_a, generator=g, dtype=DT)
        torch.testing.assert_close(M.rmul(X), X @ D)
        Y = torch.randn(d_a, 5, generator=g, dtype=DT)
        torch.testing.assert_close(M.lmul_t(Y), D.T @ Y)
        torch.testing.assert_close(M.transpose().dense(), D.T)


def test_kept_rows_read_like_streamed_sums_and_turn_into_them():
    g = torch.Generator().manual_seed(1)
    kept, sums = RowMoments(9, 11, second=True), CrossMoments(9, 11, second=True, batch_dtype=DT)
    for _ in range(3):
        a, b = torch.randn(5, 9, generator=g), torch.randn(5, 11, generator=g)
        kept.update(a, b)
        sums.update(a, b)
    for center in (False, True):
        torch.testing.assert_close(kept.covariance(center=center), sums.covariance(center=center))
        torch.testing.assert_close(kept.a.scatter(center=center), sums.a.scatter(center=center))
    R = torch.linalg.qr(torch.randn(11, 9, generator=g, dtype=DT))[0].T
    assert kept.residual(R) == pytest.approx(sums.residual(R), rel=1e-10)
    assert kept.a.sq_sum == pytest.approx(sums.a.sq_sum, rel=1e-12) and kept.n == sums.n == 15
    torch.testing.assert_close(kept.to_dense().cross, sums.cross)


class Wide(nn.Module):
    """A 2-layer MLP with a 320-wide hidden layer (wide enough for the factored path)."""

    def __init__(self, h=320, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1, self.fc2, self.fc3 = nn.Linear(10, h), nn.Linear(h, h), nn.Linear(h, 4)

    def forward(self, x):
        return self.fc3(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))))


def _wide_pair(h=320):
    A = Wide(h).double()
    perm = torch.randperm(h, generator=torch.Generator().manual_seed(1))
    B = copy.deepcopy(A)
    with torch.no_grad():
        B.fc1.weight.copy_(A.fc1.weight[perm])
        B.fc1.bias.copy_(A.fc1.bias[perm])
        B.fc2.weight.copy_(A.fc2.weight[perm][:, perm])
        B.fc2.bias.copy_(A.fc2.bias[perm])
        B.fc3.weight.copy_(A.fc3.weight[:, perm])
    g = torch.Generator().manual_seed(2)
    batches = [(torch.randn(24, 10, generator=g, dtype=DT), torch.randint(0, 4, (24,), generator=g)) for _ in range(3)]
    # fine-tuning = one gradient step on the calibration data: tau = -lr sum_n g_n x_n^T lies in the span of the
    # calibration rows (BiCo's premise), so 72 rows determine everything tau needs although the layer is 320 wide
    A_ft = copy.deepcopy(A)
    sum(ce(A_ft, b) for b in batches).backward()
    with torch.no_grad():
        for p in A_ft.parameters():
            p.sub_(0.1 * p.grad)
            p.grad = None
    tau = TaskVector.from_models(A, A_ft)
    truth = {"fc1.weight": tau["fc1.weight"][perm], "fc1.bias": tau["fc1.bias"][perm],
             "fc2.weight": tau["fc2.weight"][perm][:, perm], "fc2.bias": tau["fc2.bias"][perm],
             "fc3.weight": tau["fc3.weight"][:, perm], "fc3.bias": tau["fc3.bias"]}
    return A, A_ft, B, TaskVector(truth), batches


def ce(model, batch):
    return nn.functional.cross_entropy(model(batch[0]), batch[1])


def test_a_wide_map_fitted_from_few_rows_keeps_rows_solves_factored_and_recovers_a_permuted_copy():
    A, A_ft, B, truth, batches = _wide_pair(1024)
    res = fit_transfer(A, A_ft, B, batches, ce)  # 72 rows < 1024: rows kept, factored solves, low-rank maps
    wide = [f for fits in res.fits.values() for f in fits if f is not None and min(f.R.shape) >= 256]
    assert wide and any(isinstance(f.R, LowRankMap) for f in wide)
    err = (TaskVector({k: res.task_vector[k] - truth[k] for k in truth})).norm() / truth.norm()
    assert err < 1e-8
    # today's path (dense sums, dense solves) gives the same task vector
    ref = transfer(A, A_ft, B, batches, ce, statistics="dense", solver="dense")
    assert (TaskVector({k: ref[k] - res.task_vector[k] for k in ref})).norm() < 1e-8 * ref.norm()


def test_rows_turn_into_sums_when_a_stream_outgrows_the_width():
    A, A_ft, B, truth, _ = _wide_pair()
    g = torch.Generator().manual_seed(5)
    many = (  # a generator: the pass cannot know in advance that 480 rows will come
        (torch.randn(120, 10, generator=g, dtype=DT), torch.randint(0, 4, (120,), generator=g)) for _ in range(4))
    res = fit_transfer(A, A_ft, B, many, ce)
    wide = [f for fits in res.fits.values() for f in fits if f is not None and min(f.R.shape) >= 256]
    assert wide and all(isinstance(f.R, torch.Tensor) and f.n_rows == 480 for f in wide)
    err = (TaskVector({k: res.task_vector[k] - truth[k] for k in truth})).norm() / truth.norm()
    assert err < 1e-8


def test_diagnostics_from_kept_rows_equal_those_from_sums():
    A, A_ft, B, _, batches = _wide_pair()
    fast = fit_transfer(A, A_ft, B, batches, ce, options=TransferOptions(diagnostics=True))
    ref = fit_transfer(A, A_ft, B, batches, ce, options=TransferOptions(diagnostics=True, statistics="dense"))
    for a, b in zip(fast.layers(), ref.layers()):
        for key in ("in_cka", "out_cka", "in_similarity", "out_similarity", "in_residual_fit", "out_residual_naive"):
            if key in a:
                assert a[key] == pytest.approx(b[key], rel=1e-7, abs=1e-6), key  # sums lose ~1e-8 to cancellation


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), d_a=st.integers(6, 40), extra=st.integers(0, 20), frac=st.floats(0.05, 1.0),
       m=st.integers(0, 3))
def test_the_pad_truncate_step_on_the_complements_equals_the_step_on_the_fixed_directions(seed, d_a, extra, frac, m):
    """The two ways of computing the pad/truncate step (on the span of the fixed directions, on their complements)
    give one map and one count of unmapped directions, also where the step is singular (``m`` coordinates that A's
    fixed directions avoid and B's contain: N sends them into B's fixed subspace)."""
    from ftlab.transfer.factored import _naive_step, _naive_step_complement

    d_b = d_a + extra
    k = max(1, min(d_a, round(frac * d_a)))
    m = min(m, d_a - k, k)  # A's k directions fit beside the m coordinates; B holds them among its k
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(d_a, k, generator=g, dtype=DT)
    A[:m] = 0  # A's fixed directions avoid the first m coordinates
    B = torch.randn(d_b, k, generator=g, dtype=DT)
    B[:m] = 0
    B[:, :m] = 0
    B[:m, :m] = torch.eye(m, dtype=DT)  # B's fixed directions contain them
    W_A, W_B = torch.linalg.qr(A)[0], torch.linalg.qr(B)[0]
    tol = 1.5e-8
    R1, filled1, unmapped1 = _naive_step(W_A, W_B, tol)
    R2, filled2, unmapped2 = _naive_step_complement(W_A, W_B, tol)
    assert (filled1, unmapped1) == (filled2, unmapped2)
    assert unmapped2 >= m  # X^T sends each of the m coordinates to zero
    torch.testing.assert_close(as_dense(R1), R2, atol=1e-10, rtol=0)
