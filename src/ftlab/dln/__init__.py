"""Diagonal linear networks through pretraining and fine-tuning (Anguita et al. 2026, arXiv 2602.20062).

* :mod:`ftlab.dln.tasks`: teacher-student tasks (sparsity, overlap, noise) and Gaussian designs.
* :mod:`ftlab.dln.model`: the init scales (c, lam, gamma) as one :class:`InitScales`, the four
  weight vectors, PT init from (c, lam), the exact infinite-PT oracle, the FT reset with readout
  scale gamma, conserved quantities and k.
* :mod:`ftlab.dln.flow`: exact gradient flow (stiff ODE, hyperbolic rotations) and the authors' GD.
* :mod:`ftlab.dln.bias`: the potential q_k, k from PT, and the interpolators (implicit-bias argmin,
  minimum l1, minimum l2).
* :mod:`ftlab.dln.regimes`: l-order, pretraining dependence (PD), regimes I-IV and their corners.
* :mod:`ftlab.dln.simulate`: a full PT -> FT run compared with its implicit-bias prediction.

numpy/scipy only: importing ``ftlab.dln`` never imports torch.
"""

from ftlab.dln.bias import (
    InterpolatorResult,
    Q_k,
    c_ft_from_pt,
    k_from_pt,
    min_l1_interpolator,
    min_l2_interpolator,
    q_k,
    q_k_prime,
    q_k_prime_inv,
    q_k_second,
    solve_implicit_bias,
)
from ftlab.dln.flow import TrainResult, gradient_descent, gradient_flow, invariant_drift
from ftlab.dln.model import InitScales, Weights, beta_coefficients, ft_reset, init_pt, oracle_pt, rotate
from ftlab.dln.regimes import (
    CORNER_C,
    REGIME_COLORS,
    REGIME_CORNERS,
    REGIMES,
    Metrics,
    l_order,
    l_order_of_t,
    metrics,
    pretraining_dependence,
    pt_sensitivity,
    regime,
)
from ftlab.dln.simulate import SimulationResult, simulate_ptft
from ftlab.dln.tasks import Problem, TaskSpec, n_samples, sample_design, sample_labels, sample_problem, sample_teachers

__all__ = [
    "InterpolatorResult", "Q_k", "c_ft_from_pt", "k_from_pt", "min_l1_interpolator", "min_l2_interpolator",
    "q_k", "q_k_prime", "q_k_prime_inv", "q_k_second", "solve_implicit_bias",
    "TrainResult", "gradient_descent", "gradient_flow", "invariant_drift",
    "CORNER_C", "REGIME_COLORS", "REGIME_CORNERS", "REGIMES", "Metrics", "l_order", "l_order_of_t", "metrics",
    "pretraining_dependence", "pt_sensitivity", "regime",
    "InitScales", "Weights", "beta_coefficients", "ft_reset", "init_pt", "oracle_pt", "rotate",
    "SimulationResult", "simulate_ptft",
    "Problem", "TaskSpec", "n_samples", "sample_design", "sample_labels", "sample_problem", "sample_teachers",
]
