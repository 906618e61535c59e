"""Diagonal linear networks through pretraining and fine-tuning (Anguita et al. 2026, arXiv 2602.20062).

numpy/scipy only: importing ``ftlab.dln`` never imports torch.
"""

from ftlab.dln.bias import Q_k, c_ft_from_pt, k_from_pt, q_k, q_k_prime, q_k_prime_inv, q_k_second
from ftlab.dln.tasks import Problem, TaskSpec, n_samples, sample_design, sample_labels, sample_problem, sample_teachers

__all__ = [
    "Q_k", "c_ft_from_pt", "k_from_pt", "q_k", "q_k_prime", "q_k_prime_inv", "q_k_second",
    "Problem", "TaskSpec", "n_samples", "sample_design", "sample_labels", "sample_problem", "sample_teachers",
]
