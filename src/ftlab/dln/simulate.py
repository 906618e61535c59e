"""Pretrain-then-fine-tune simulation of the diagonal network, checked against its implicit bias.

:func:`simulate_ptft` samples a task (:mod:`ftlab.dln.tasks`), pretrains (the exact "infinite-PT"
oracle of the authors' public code by default, or gradient flow / GD on ``round(alpha_pt D)`` PT samples),
applies the FT reset (:func:`ftlab.dln.model.ft_reset`), fine-tunes on ``round(alpha D)`` samples
and compares the result with the implicit-bias prediction ``argmin Q_k s.t. X beta = y``
(the implicit-bias theorem of Anguita et al. 2026, arXiv 2602.20062), where ``k`` is read off the FT
start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from ftlab.core.validate import check_choice, check_int, check_positive
from ftlab.dln.bias import min_l2_interpolator, solve_implicit_bias
from ftlab.dln.flow import TrainResult, gradient_descent, gradient_flow
from ftlab.dln.model import InitScales, check_setting, ft_reset, init_pt, oracle_pt
from ftlab.dln.tasks import TaskSpec, sample_problem

Method = Literal["flow", "gd"]

__all__ = ["MIN_DIM", "SimulationResult", "memory_estimate", "simulate_ptft"]

#: The smallest dimension D of a simulation, the same in every function and command that simulates.
MIN_DIM = 2


def memory_estimate(*, dim: int, alpha: float, alpha_pt: float | None = None) -> int:
    """Bytes of the largest arrays of one simulation: the float64 designs (N x D for FT, and PT when
    ``alpha_pt`` is given) and two N x N solver matrices (gradient flow's Jacobian or the dual Newton
    Hessian), N = round(alpha D) capped at D."""
    n = min(int(round(alpha * dim)), dim)
    n_pt = 0 if alpha_pt is None else int(round(alpha_pt * dim))
    return 8 * (n * dim + n_pt * dim + 2 * n * n + 4 * dim)


@dataclass(frozen=True)
class SimulationResult:
    """One PT+FT run.

    error : FT generalization error ``(1/D) ||beta_hat - beta*_FT||^2`` (= test MSE without label noise).
    error_pred : the same for the implicit-bias prediction ``beta_pred``.
    distance : ``||beta_hat - beta_pred|| / max(||beta_pred||, 1e-300)`` (relative).
    pt_error : ``(1/D) ||beta_PT - beta*_PT||^2`` (0 for the oracle).
    converged : both stages reached their training tolerance and the prediction solver converged.
    n_iter : FT integrator/GD steps. residual : final FT training MSE.
    invariant_drift : of the FT stage (see :class:`ftlab.dln.flow.TrainResult`).
    beta_hat, beta_pred, beta_pt, beta_ft_star, k : vectors (D,).
    """

    error: float
    error_pred: float
    distance: float
    pt_error: float
    converged: bool
    n_iter: int
    residual: float
    invariant_drift: float
    beta_hat: np.ndarray
    beta_pred: np.ndarray
    beta_pt: np.ndarray
    beta_ft_star: np.ndarray
    k: np.ndarray


def _train(weights, X, y, method: str) -> TrainResult:
    """Exact gradient flow to training MSE 1e-20, or the authors' GD (lr 0.5, stop at training MSE < 1e-4)."""
    if method == "flow":
        return gradient_flow(weights, X, y)
    return gradient_descent(weights, X, y)


def simulate_ptft(spec: TaskSpec, scales: InitScales, *, alpha: float, dim: int, seed: int,
                  alpha_pt: float | None = None, method: Method = "flow") -> SimulationResult:
    """Simulate PT then FT and compare with the implicit-bias prediction.

    spec : task statistics. scales : PT init scales ``c, lam`` and FT readout scale ``gamma``.
    alpha : FT samples per dimension (> 0). dim : D. seed : seeds the teachers and both data sets
    (same teachers for every alpha).
    alpha_pt : None = exact infinite-PT oracle (PT weights constructed for ``beta*_PT``);
    otherwise PT is trained on ``round(alpha_pt D)`` samples (label noise ``spec.pt_noise``)
    from the (c, lam) init with ``method``. method : ``"flow"`` (exact gradient flow,
    :func:`ftlab.dln.flow.gradient_flow`, to training MSE 1e-20) or ``"gd"`` (the authors' GD,
    :func:`ftlab.dln.flow.gradient_descent` with its defaults lr 0.5, stop at training MSE < 1e-4;
    call the two functions directly for other settings).
    The prediction uses ``k`` of the actual FT start (equal to :func:`ftlab.dln.bias.k_from_pt`
    of the PT solution). FT with more samples than dimensions (alpha >= 1) has a unique
    interpolator; the prediction is then the least-squares solution.
    """
    check_setting(spec, scales)
    check_positive("alpha", alpha)
    dim = check_int("dim", dim, MIN_DIM)
    seed = check_int("seed", seed, 0)
    check_choice("method", method, ("flow", "gd"))
    prob = sample_problem(spec, alpha=alpha, dim=dim, seed=seed, alpha_pt=alpha_pt)
    if alpha_pt is None:
        w_pt, pt_ok = oracle_pt(prob.beta_pt_star, c=scales.c, lam=scales.lam), True
    else:
        pt = _train(init_pt(dim, c=scales.c, lam=scales.lam), prob.X_pt, prob.y_pt, method)
        w_pt, pt_ok = pt.weights, pt.converged
    w_ft = ft_reset(w_pt, gamma=scales.gamma)
    k = w_ft.k
    ft = _train(w_ft, prob.X_ft, prob.y_ft, method)
    X, y = prob.X_ft, prob.y_ft
    pred = solve_implicit_bias(X, y, k) if X.shape[0] < dim else min_l2_interpolator(X, y)
    beta_pt = w_pt.beta
    d = float(dim)
    return SimulationResult(
        error=float(np.sum((ft.beta - prob.beta_ft_star) ** 2) / d),
        error_pred=float(np.sum((pred.beta - prob.beta_ft_star) ** 2) / d),
        distance=float(np.linalg.norm(ft.beta - pred.beta) / max(float(np.linalg.norm(pred.beta)), 1e-300)),
        pt_error=float(np.sum((beta_pt - prob.beta_pt_star) ** 2) / d),
        converged=bool(pt_ok and ft.converged and pred.converged),
        n_iter=ft.n_iter,
        residual=ft.residual,
        invariant_drift=ft.invariant_drift,
        beta_hat=ft.beta,
        beta_pred=pred.beta,
        beta_pt=beta_pt,
        beta_ft_star=prob.beta_ft_star,
        k=k,
    )
