"""Replica theory of the fine-tuning error in diagonal linear networks (arXiv 2602.20062; docs/replica.md).

High-dimensional limit ``D -> inf`` at fixed ``alpha = N_FT / D``: the interpolator
``argmin Q_k(beta) s.t. X beta = y`` (the endpoint of FT gradient flow) has per-coordinate error
``E_g`` given by a replica-symmetric fixed point of a scalar denoising problem (Gardner-style
analysis as in GCMProject / Loureiro et al. 2021; Bayati & Montanari 2011 for the l1 analogue).

Layers: :mod:`.scalar` (prox of ``theta q_k``), :mod:`.expect` (expectations by quadrature or
Monte Carlo), :mod:`.prior` (joint law of ``(beta*_FT, k)``), :mod:`.solver` (fixed point),
:mod:`.curves` (learning curves and simulations).
"""

from ftlab.dln.replica.curves import (
    ExpectationOptions,
    learning_curve,
    make_expectation,
    setting_point,
    simulate_curve,
    simulated_error,
    solve_curve,
    split_point,
)
from ftlab.dln.replica.expect import Mixture, MonteCarloExpectation, QuadratureExpectation
from ftlab.dln.replica.prior import ft_prior, single_task_prior
from ftlab.dln.replica.scalar import prox_qk, prox_qk_derivatives
from ftlab.dln.replica.solver import FixedPoint, solve_damped, solve_point

__all__ = ["ExpectationOptions", "learning_curve", "make_expectation", "setting_point", "simulate_curve",
           "simulated_error", "solve_curve", "split_point", "Mixture", "MonteCarloExpectation",
           "QuadratureExpectation", "ft_prior", "single_task_prior", "prox_qk", "prox_qk_derivatives",
           "FixedPoint", "solve_damped", "solve_point"]
