"""A non-converging SVD (torch's divide-and-conquer driver) falls back to LAPACK's gesvd, same result."""

import torch

from ftlab.transfer import align


def _failing_once(monkeypatch):
    real = torch.linalg.svd
    calls = {"n": 0}

    def svd(M, full_matrices=True):
        calls["n"] += 1
        if calls["n"] == 1:
            raise torch.linalg.LinAlgError("linalg.svd: The algorithm failed to converge (planted)")
        return real(M, full_matrices=full_matrices)

    monkeypatch.setattr(torch.linalg, "svd", svd)
    return calls


def test_svd_falls_back_to_gesvd(monkeypatch):
    g = torch.Generator().manual_seed(0)
    M = torch.randn(7, 5, generator=g, dtype=torch.float64)
    U0, s0, Vh0 = torch.linalg.svd(M, full_matrices=True)
    calls = _failing_once(monkeypatch)
    U, s, Vh = align.svd(M, full_matrices=True)
    assert calls["n"] == 1  # torch's driver failed; the fallback did not call it again
    assert U.shape == (7, 7) and s.shape == (5,) and Vh.shape == (5, 5) and U.dtype == torch.float64
    torch.testing.assert_close(s, s0)
    torch.testing.assert_close(U[:, :5] * s @ Vh, M)
    torch.testing.assert_close(U.T @ U, torch.eye(7, dtype=torch.float64))


def test_procrustes_survives_a_failed_svd(monkeypatch):
    g = torch.Generator().manual_seed(1)
    C = torch.randn(6, 6, generator=g, dtype=torch.float64)
    want = align.procrustes(C)
    _failing_once(monkeypatch)
    torch.testing.assert_close(align.procrustes(C), want)
