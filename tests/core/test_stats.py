"""Streaming float64 accumulators equal one-shot computations; merging is exact; CKA and residuals agree."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ftlab.core.stats import CrossMoments, Moments


def data(n=200, p=7, q=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(n, p, generator=g, dtype=torch.float64) + 0.5
    mix = torch.randn(q, q, generator=g, dtype=torch.float64)
    B = A[:, :q] @ mix + 0.3 * torch.randn(n, q, generator=g, dtype=torch.float64)
    return A, B


@pytest.mark.parametrize("splits", [[200], [1, 99, 100], [13] * 15 + [5]])
def test_streaming_equals_one_shot(splits):
    A, B = data()
    cm = CrossMoments(7, 5, second=True)
    i = 0
    for s in splits:
        cm.update(A[i:i + s], B[i:i + s])
        i += s
    assert cm.n == 200
    torch.testing.assert_close(cm.covariance(), A.T @ B, rtol=1e-12, atol=1e-12)
    Ac, Bc = A - A.mean(0), B - B.mean(0)
    torch.testing.assert_close(cm.covariance(center=True), Ac.T @ Bc, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(cm.a.scatter(center=True), Ac.T @ Ac, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(cm.b.scatter(), B.T @ B, rtol=1e-12, atol=1e-12)


def test_merge_equals_whole():
    A, B = data()
    whole = CrossMoments(7, 5, second=True).update(A, B)
    left = CrossMoments(7, 5, second=True).update(A[:77], B[:77])
    right = CrossMoments(7, 5, second=True).update(A[77:], B[77:])
    left.merge(right)
    torch.testing.assert_close(left.cross, whole.cross, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(left.a.gram, whole.a.gram, rtol=1e-12, atol=1e-12)
    assert left.n == whole.n
    with pytest.raises(ValueError):
        left.merge(CrossMoments(7, 4))


def test_float32_batches_are_close_to_float64():
    A, B = data(seed=1)
    exact = CrossMoments(7, 5).update(A, B)
    fast = CrossMoments(7, 5, batch_dtype=torch.float32)
    for i in range(0, 200, 50):
        fast.update(A[i:i + 50].float(), B[i:i + 50].float())
    rel = torch.linalg.norm(fast.cross - exact.cross) / torch.linalg.norm(exact.cross)
    assert 0 < rel < 1e-5


def test_residual_matches_direct():
    A, B = data(seed=2)
    cm = CrossMoments(7, 5, second=True).update(A, B)
    R = torch.linalg.qr(torch.randn(7, 5, dtype=torch.float64))[0]
    direct = float(torch.linalg.norm(A @ R - B) / torch.linalg.norm(B))
    assert cm.residual(R) == pytest.approx(direct, rel=1e-9)
    assert np.isnan(CrossMoments(7, 5).update(A, B).residual(R))  # no second moments: NaN, not a wrong number


def test_moments_mean_and_bad_shapes():
    x = torch.arange(12.0).reshape(4, 3)
    m = Moments(3).update(x[:1]).update(x[1:])
    torch.testing.assert_close(m.mean, x.double().mean(0))
    with pytest.raises(ValueError, match="expected"):
        m.update(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="second"):
        m.scatter()
    with pytest.raises(ValueError, match="aligned"):
        CrossMoments(3, 3).update(torch.zeros(2, 3), torch.zeros(3, 3))


@pytest.mark.parametrize("flush_rows", [1, 50, 10_000])
def test_float32_staging_buffer_flushes_exactly_once(flush_rows):
    """float32 data: products staged in float32 and flushed into float64; reading mid-stream flushes too."""
    A, B = data(seed=3)
    exact = CrossMoments(7, 5, second=True, batch_dtype=torch.float64).update(A, B)
    staged = CrossMoments(7, 5, second=True, flush_rows=flush_rows)
    for i in range(0, 200, 40):
        staged.update(A[i:i + 40].float(), B[i:i + 40].float())
        if i == 80:
            _ = staged.cross  # a read in the middle must not lose or double-count staged rows
    for got, ref in ((staged.cross, exact.cross), (staged.a.gram, exact.a.gram), (staged.b.gram, exact.b.gram)):
        assert float(torch.linalg.norm(got - ref) / torch.linalg.norm(ref)) < 1e-5
    merged = CrossMoments(7, 5, flush_rows=flush_rows).update(A[:100].float(), B[:100].float())
    merged.merge(CrossMoments(7, 5, flush_rows=flush_rows).update(A[100:].float(), B[100:].float()))
    assert float(torch.linalg.norm(merged.cross - exact.cross) / torch.linalg.norm(exact.cross)) < 1e-5


def test_cka_after_a_map_matches_direct_computation():
    from ftlab.core.geometry import cka_from_moments, linear_cka

    A, B = data(seed=4)
    cm = CrossMoments(7, 5, second=True).update(A, B)
    R = torch.linalg.qr(torch.randn(7, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))[0]
    assert cka_from_moments(cm, R) == pytest.approx(linear_cka((A @ R).numpy(), B.numpy()), rel=1e-9)
    Q = torch.linalg.qr(torch.randn(7, 7, dtype=torch.float64))[0]
    sq = CrossMoments(7, 7, second=True).update(A, A @ Q)
    assert cka_from_moments(sq, Q) == pytest.approx(cka_from_moments(sq), rel=1e-12)  # invariant to orthogonal maps


def test_kernel_sums_stream_and_merge_exactly():
    A, B = data(seed=5)
    one = CrossMoments(7, 5, second=True, kernel=True, batch_dtype=torch.float64).update(A, B)
    parts = [CrossMoments(7, 5, second=True, kernel=True, batch_dtype=torch.float64).update(A[i:i + 9], B[i:i + 9])
             for i in range(0, A.shape[0], 9)]
    merged = parts[0]
    for p in parts[1:]:
        merged.merge(p)
    a2, b2 = (A.double() ** 2).sum(1), (B.double() ** 2).sum(1)
    torch.testing.assert_close(one.b_sq_weighted_a, b2 @ A.double())
    torch.testing.assert_close(merged.a_sq_weighted_b, a2 @ B.double())
    assert merged.ab_sq_sum == pytest.approx(float(a2 @ b2), rel=1e-12) == one.ab_sq_sum
    assert merged.a.sq_sq_sum == pytest.approx(float(a2 @ a2), rel=1e-12)
    with pytest.raises(ValueError, match="kernel"):
        one.merge(CrossMoments(7, 5, second=True))


def test_precision_row_norms_and_size_are_tracked():
    from ftlab.core.stats import cross_moments_nbytes

    g = torch.Generator().manual_seed(4)
    a32, b32 = torch.randn(50, 7, generator=g), torch.randn(50, 5, generator=g)
    staged = CrossMoments(7, 5).update(a32, b32)  # float32 rows, float32 staging (batch_dtype None)
    exact = CrossMoments(7, 5, batch_dtype=torch.float64).update(a32, b32)
    assert staged.eps == torch.finfo(torch.float32).eps and staged.a.row_eps == torch.finfo(torch.float32).eps
    # float32 x float32 products are exact in float64: these sums have float64 precision
    assert exact.eps == torch.finfo(torch.float64).eps
    assert torch.equal(exact.covariance(), a32.double().T @ b32.double())
    assert exact.a.sq_sum == pytest.approx(float(a32.double().pow(2).sum()), rel=1e-12)
    assert exact.b.sq_sum == pytest.approx(float(b32.double().pow(2).sum()), rel=1e-12)
    merged = CrossMoments(7, 5, batch_dtype=torch.float64).merge(exact)
    assert merged.a.sq_sum == exact.a.sq_sum and merged.eps == exact.eps
    assert cross_moments_nbytes(7, 5, batch_dtype=torch.float64) == 8 * 35 == exact.nbytes()
    assert cross_moments_nbytes(7, 5, second=True) == 12 * (35 + 49 + 25)


@pytest.mark.parametrize("batch_dtype,flush_rows", [(torch.float32, 8192), (None, 8192), (None, 16)])
def test_float32_product_error_stays_within_the_stated_bound(batch_dtype, flush_rows):
    """Float32 products accumulated in float64: the Frobenius error of the sums against the float64 sums of the same
    (float32) rows is within ``bound`` (sum over flushed blocks of gamma_m ||A_blk||_F ||B_blk||_F), the bound is
    not vacuous (within 1e4 of the error), and float64 products state a zero bound."""
    g = torch.Generator().manual_seed(3)
    A = (torch.randn(600, 40, generator=g) * 3 + 1).to(torch.float32)
    B = (A[:, :30] @ torch.randn(30, 30, generator=g) + 0.1).to(torch.float32)
    exact = CrossMoments(40, 30, second=True, batch_dtype=torch.float64)
    st = CrossMoments(40, 30, second=True, batch_dtype=batch_dtype, flush_rows=flush_rows)
    for i in range(0, 600, 50):
        exact.update(A[i:i + 50], B[i:i + 50])
        st.update(A[i:i + 50], B[i:i + 50])
    err = float(torch.linalg.norm(st.cross - exact.cross))
    assert exact.bound == 0.0 and exact.a.bound == 0.0
    assert 0 < err <= st.bound < 1e4 * err
    assert float(torch.linalg.norm(st.a.gram - exact.a.gram)) <= st.a.bound
    # the bound is gamma_m summed over the blocks: exactly computable from the rows
    from ftlab.core.stats import gamma32

    m = 600 if batch_dtype is None and flush_rows > 600 else 50  # rows per flushed block (staged until read, or per batch)
    want = sum(gamma32(m) * float(torch.linalg.norm(A[i:i + m].double())) * float(torch.linalg.norm(B[i:i + m].double()))
               for i in range(0, 600, m))
    assert st.bound == pytest.approx(want, rel=1e-9)


def test_small_float64_batches_are_gathered_then_multiplied_to_the_same_sums():
    """Batches of fewer rows than the gather size are held (as copies owning their memory) and multiplied together:
    the sums equal the one-shot product at every read, also between gathers."""
    from ftlab.core import stats as st

    A, B = data(n=300)
    cm = CrossMoments(7, 5, second=True, batch_dtype=torch.float64)
    big = torch.cat([A, torch.zeros(300, 3, dtype=torch.float64)], 1)  # rows as views of a wider tensor
    i = 0
    for s in [3] * 20 + [st._GATHER_ROWS + 1] + [7] * 5:
        cm.update(big[i:i + s, :7], B[i:i + s])
        i += s
        held = cm._cross._gathered
        assert all(a.untyped_storage().nbytes() == a.numel() * 8 for a, _ in held)  # no view of the wide tensor
        if s == 3 and i == 60:  # mid-way: a read multiplies what is held
            torch.testing.assert_close(cm.cross, A[:60].T @ B[:60], rtol=1e-12, atol=1e-12)
    assert cm._cross._gathered_rows < st._GATHER_ROWS
    torch.testing.assert_close(cm.cross, A[:i].T @ B[:i], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(cm.a.scatter(), A[:i].T @ A[:i], rtol=1e-12, atol=1e-12)
