"""Properties of PR, ENSD and linear CKA (closed forms, invariances, streamed == one-shot)."""

import math

import numpy as np
import pytest
import torch

from ftlab.core.geometry import (
    GeometryAccumulator,
    cka_from_moments,
    ensd,
    layer_geometry,
    linear_cka,
    participation_ratio,
)
from ftlab.core.stats import CrossMoments
from ftlab.models.resnet import resnet18


def _orth(d, rng):
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    return q


def test_pr_isotropic_is_dimension():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((20000, 10))
    assert participation_ratio(X) == pytest.approx(10, rel=0.02)
    assert participation_ratio(X, center=True) == pytest.approx(10, rel=0.02)


def test_pr_planted_spectrum_and_rank_one():
    # exact closed form: columns with std s_i, orthogonalised -> PR = (sum s^2)^2 / sum s^4
    rng = np.random.default_rng(1)
    n, s = 500, np.array([3.0, 2.0, 1.0, 0.5])
    Q, _ = np.linalg.qr(rng.standard_normal((n, 4)))
    X = Q * s @ _orth(4, rng)
    assert participation_ratio(X) == pytest.approx((s**2).sum() ** 2 / (s**4).sum(), rel=1e-12)
    assert participation_ratio(np.outer(rng.standard_normal(50), rng.standard_normal(7))) == pytest.approx(1.0)


def test_pr_centering_removes_mean_direction():
    rng = np.random.default_rng(2)
    X = rng.standard_normal((4000, 5)) + 100.0  # huge common offset -> uncentred PR ~ 1
    assert participation_ratio(X) < 1.01
    assert participation_ratio(X, center=True) == pytest.approx(5, rel=0.05)


def test_pr_same_in_sample_and_feature_space():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((30, 80)) * np.linspace(0.1, 2, 80)
    assert participation_ratio(X) == pytest.approx(participation_ratio(X.T.copy()), rel=1e-12)


def test_ensd_self_is_pr_and_cauchy_schwarz_bound():
    rng = np.random.default_rng(4)
    X = rng.standard_normal((200, 12)) * np.linspace(0.2, 3, 12)
    Y = X @ rng.standard_normal((12, 12)) * 0.3 + rng.standard_normal((200, 12))
    for center in (False, True):
        for space in ("features", "samples"):
            assert ensd(X, X, center=center, space=space) == pytest.approx(participation_ratio(X, center=center), rel=1e-12)
            e = ensd(X, Y, center=center, space=space)
            bound = np.sqrt(participation_ratio(X, center=center) * participation_ratio(Y, center=center))
            assert 0 <= e <= bound + 1e-9


def test_ensd_counts_shared_dimensions_of_planted_subspaces():
    # X spans coordinates 0..5, Y spans 3..8, both isotropic: 3 shared dimensions (Giaffar et al.)
    rng = np.random.default_rng(11)
    n = 200000
    X = np.zeros((n, 9))
    Y = np.zeros((n, 9))
    X[:, :6] = rng.standard_normal((n, 6))
    Y[:, 3:] = rng.standard_normal((n, 6))
    assert ensd(X, Y) == pytest.approx(3.0, rel=0.02)


def test_ensd_disjoint_subspaces_is_zero():
    rng = np.random.default_rng(5)
    X = np.zeros((100, 6))
    Y = np.zeros((100, 6))
    X[:, :3] = rng.standard_normal((100, 3))
    Y[:, 3:] = rng.standard_normal((100, 3))
    assert ensd(X, Y) == pytest.approx(0.0, abs=1e-12)


def test_cka_invariances_and_identity():
    rng = np.random.default_rng(6)
    X = rng.standard_normal((60, 8)) @ rng.standard_normal((8, 20))
    Y = np.tanh(X @ rng.standard_normal((20, 15))) + 0.1 * rng.standard_normal((60, 15))
    for unbiased in (False, True):
        base = linear_cka(X, Y, unbiased=unbiased)
        assert linear_cka(X, X, unbiased=unbiased) == pytest.approx(1.0, rel=1e-12)
        assert linear_cka(X @ _orth(20, rng), Y, unbiased=unbiased) == pytest.approx(base, rel=1e-10)
        assert linear_cka(X, 7.5 * Y, unbiased=unbiased) == pytest.approx(base, rel=1e-10)
        assert linear_cka(X + 3.0, Y, unbiased=unbiased) == pytest.approx(base, rel=1e-9)
    assert 0 < linear_cka(X, Y) < 1


def test_cka_matches_hsic_definition_with_centering_matrix():
    # independent computation: HSIC(K, L) = tr(K H L H) with H = I - 11^T/n
    rng = np.random.default_rng(7)
    X, Y = rng.standard_normal((40, 50)), rng.standard_normal((40, 3))
    H = np.eye(40) - 1 / 40
    K, L = X @ X.T, Y @ Y.T
    hsic = lambda a, b: np.trace(a @ H @ b @ H)  # noqa: E731
    assert linear_cka(X, Y) == pytest.approx(hsic(K, L) / np.sqrt(hsic(K, K) * hsic(L, L)), rel=1e-10)


def test_unbiased_cka_near_zero_for_independent_data():
    rng = np.random.default_rng(8)
    X, Y = rng.standard_normal((300, 200)), rng.standard_normal((300, 200))
    # the biased estimator is strongly inflated when p ~ n; the unbiased one is centred on 0
    assert linear_cka(X, Y) > 0.3
    assert abs(linear_cka(X, Y, unbiased=True)) < 0.05


def test_torch_and_numpy_agree_and_conv_maps_flatten():
    rng = np.random.default_rng(9)
    X = rng.standard_normal((16, 3, 4, 4)).astype(np.float32)
    t = torch.from_numpy(X)
    assert participation_ratio(t) == pytest.approx(participation_ratio(X.reshape(16, -1)), rel=1e-12)


@pytest.mark.parametrize("center", [False, True])
def test_streamed_equals_one_shot(center):
    rng = np.random.default_rng(10)
    X = rng.standard_normal((97, 7)) * np.linspace(0.5, 2, 7) + 0.3
    Y = X @ rng.standard_normal((7, 7)) + rng.standard_normal((97, 7))
    a, b = GeometryAccumulator(), GeometryAccumulator()
    for i, sl in enumerate(np.array_split(np.arange(97), 6)):
        (a if i % 2 else b).update(X[sl], torch.from_numpy(Y[sl]))
    acc = GeometryAccumulator().merge(a).merge(b)
    assert acc.n == 97
    assert acc.participation_ratio(center=center) == pytest.approx(participation_ratio(X, center=center), rel=1e-10)
    pr_y = participation_ratio(Y, center=center)
    assert acc.participation_ratio(center=center, which="y") == pytest.approx(pr_y, rel=1e-10)
    for space in ("features", "samples"):
        assert acc.ensd(center=center, space=space) == pytest.approx(ensd(X, Y, center=center, space=space), rel=1e-10)
    for unbiased in (False, True):
        assert acc.linear_cka(unbiased=unbiased) == pytest.approx(linear_cka(X, Y, unbiased=unbiased), rel=1e-9)


def test_zero_variance_gives_nan_everywhere_one_shot_streamed_and_from_moments():
    rng = np.random.default_rng(3)
    X, const = rng.standard_normal((12, 3)), np.ones((12, 4))
    assert math.isnan(participation_ratio(np.zeros((5, 3))))
    assert math.isnan(participation_ratio(const, center=True))
    assert math.isnan(ensd(X, np.zeros((7, 3))))
    for unbiased in (False, True):
        assert math.isnan(linear_cka(X, const, unbiased=unbiased))
        assert math.isnan(GeometryAccumulator().update(X, const).linear_cka(unbiased=unbiased))
    cm = CrossMoments(3, 4, second=True).update(torch.from_numpy(X), torch.from_numpy(const))
    assert math.isnan(cka_from_moments(cm))
    assert math.isnan(cka_from_moments(CrossMoments(3, 4).update(torch.from_numpy(X), torch.from_numpy(const))))


def test_cka_from_moments_equals_one_shot_also_after_a_map():
    rng = np.random.default_rng(4)
    A, B = rng.standard_normal((40, 5)), rng.standard_normal((40, 6))
    R = torch.linalg.qr(torch.randn(6, 5, dtype=torch.float64))[0].T  # 5 x 6, orthonormal rows
    cm = CrossMoments(5, 6, second=True, kernel=True).update(torch.from_numpy(A), torch.from_numpy(B))
    assert cka_from_moments(cm) == pytest.approx(linear_cka(A, B), rel=1e-10)
    assert cka_from_moments(cm, unbiased=True) == pytest.approx(linear_cka(A, B, unbiased=True), rel=1e-9)
    assert cka_from_moments(cm, R) == pytest.approx(linear_cka(A @ R.numpy(), B), rel=1e-10)


def test_bad_input_raises_one_line_value_error():
    with pytest.raises(ValueError, match="shape"):
        participation_ratio(np.zeros((0, 3)))
    with pytest.raises(ValueError, match="samples"):
        linear_cka(np.ones((5, 3)), np.ones((6, 3)))
    with pytest.raises(ValueError, match="non-finite"):
        participation_ratio(np.array([[1.0, np.nan]]))
    with pytest.raises(ValueError, match="n_samples"):
        linear_cka(np.eye(3), np.eye(3), unbiased=True)
    with pytest.raises(ValueError, match="features"):
        ensd(np.ones((5, 3)), np.ones((5, 4)))
    with pytest.raises(RuntimeError, match="update"):  # misuse, not bad input
        GeometryAccumulator().ensd()


def test_layer_geometry_of_a_model_with_itself():
    net = resnet18(width=2, in_channels=1, num_classes=2, seed=0).eval()
    X = torch.randn(20, 1, 10, 10)
    for row in layer_geometry(net, net, X, ["stem", "layer2", "pool"]):
        assert row["ensd"] == pytest.approx(row["pr_pre"], rel=1e-9)
        assert row["pr_post"] == pytest.approx(row["pr_pre"], rel=1e-12)
        assert row["cka"] == pytest.approx(1.0, rel=1e-9)
