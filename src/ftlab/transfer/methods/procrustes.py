"""Procrustes-map methods: BiCo and its one-sided ablations.

All three fit, per capture point, an input map ``R_in`` and an output map ``R_out`` by
orthogonal Procrustes (:func:`ftlab.transfer.align.fit_map`) and transport
``tau_B = R_out^T tau_A R_in``. They differ only in the statistics each map is fitted on:

======================  ====================  ===================================================
method                  ``in_map``            ``out_map``
======================  ====================  ===================================================
``bico``                ``act`` (inputs)      ``grad`` (dL/d output)  -- Son et al. 2026
``activation_only``     ``act``               ``act`` (outputs)       -- Theseus-like, Rinaldi et al. 2026
``gradient_only``       ``grad_in`` (dL/dx)   ``grad``
======================  ====================  ===================================================

``gradient_only`` fits ``R_in`` on input-side gradients (the ``bico_gradin`` variant of the
third-party reimplementation); where no input gradient exists (the input is data) it falls
back to the pad/truncate map, with a warning. Every method accepts ``in_map``/``out_map``
overrides (``naive`` included) for the full ablation grid. Embedding inputs (the vocabulary)
are always mapped by identity; norm layers only use ``R_out``.
"""

from __future__ import annotations

import torch

from ftlab.transfer.align import MapFit, fit_map, naive_map
from ftlab.transfer.methods import register
from ftlab.transfer.problem import TransferProblem
from ftlab.transfer.spec import Point
from ftlab.transfer.task_vector import TaskVector
from ftlab.transfer.transport import transport
from ftlab.validate import check_choice, check_positive, check_range

__all__ = ["ProcrustesTransfer"]

IN_MAPS = ("act", "grad_in", "naive")
OUT_MAPS = ("grad", "act", "naive")


class ProcrustesTransfer:
    """Fit ``R_in``/``R_out`` per point from streamed cross-covariances, then transport.

    Parameters
    ----------
    in_map, out_map:
        Statistics for each map (see the module table).
    center:
        Centre rows before forming cross-covariances (default off [U]).
    whiten_p:
        Partial whitening exponent ``p`` in ``[0, 1/2]`` (default 0 = off [U]).
    eps:
        Relative eigenvalue floor for whitening.
    depth_scale:
        Multiplies the transported task vector (e.g. ``L_A / L_B`` when source layers are reused;
        default 1 [U]).
    """

    calibration = "maps"

    def __init__(self, *, in_map: str = "act", out_map: str = "grad", center: bool = False, whiten_p: float = 0.0,
                 eps: float = 1e-8, depth_scale: float = 1.0, name: str = "bico"):
        self.in_map = check_choice("in_map", in_map, IN_MAPS)
        self.out_map = check_choice("out_map", out_map, OUT_MAPS)
        self.center = bool(center)
        self.whiten_p = check_range("whiten_p", whiten_p, 0.0, 0.5)
        self.eps = check_positive("eps", eps)
        self.depth_scale = check_positive("depth_scale", depth_scale)
        self.name = name
        self.problem: TransferProblem | None = None
        self.fits: dict[str, tuple[MapFit | None, MapFit | None]] = {}

    def requirements(self, point: Point) -> dict[str, str | None]:
        """Which statistic each side of ``point`` needs: ``{"in": ..., "out": ...}`` (``None`` = none)."""
        inside = None if point.kind in ("embedding", "norm", "norm2d") or self.in_map == "naive" else self.in_map
        outside = None if self.out_map == "naive" else self.out_map
        return {"in": inside, "out": outside}

    @property
    def needs_second_moments(self) -> bool:
        return self.whiten_p > 0

    def prepare(self, problem: TransferProblem, stats: dict) -> ProcrustesTransfer:
        """Fit the maps from ``stats[(target_point, side)]`` (:class:`~ftlab.stats.CrossMoments`); returns self."""
        self.problem = problem
        self.fits = {}
        for tp in problem.pairs:
            req = self.requirements(problem.target_spec.points[tp])
            fits: list[MapFit | None] = []
            for side in ("in", "out"):
                if req[side] is None:
                    fits.append(None)
                else:
                    fits.append(fit_map(stats[(tp, side)], source=req[side], center=self.center,
                                        whiten_p=self.whiten_p, eps=self.eps, name=f"{tp} ({side})"))
            self.fits[tp] = (fits[0], fits[1])
        return self

    def maps(self) -> dict[str, tuple[torch.Tensor | None, torch.Tensor]]:
        """``{target_point: (R_in, R_out)}`` (float64); naive or identity where a side was not fitted."""
        if self.problem is None:
            raise ValueError(f"{self.name}: call prepare() before apply()")
        out = {}
        for tp, sp in self.problem.pairs.items():
            pt_b, pt_a = self.problem.target_spec.points[tp], self.problem.source_spec.points[sp]
            f_in, f_out = self.fits[tp]
            if pt_b.kind == "embedding":
                R_in = None  # the vocabulary is shared: tau_B = tau_A R_out needs no input map (no V x V identity)
            else:
                R_in = f_in.R if f_in is not None else naive_map(pt_a.in_dim, pt_b.in_dim)
            R_out = f_out.R if f_out is not None else naive_map(pt_a.out_dim, pt_b.out_dim)
            out[tp] = (R_in, R_out)
        return out

    def apply(self, tau_a: TaskVector) -> TaskVector:
        """``tau_B = R_out^T tau_A R_in`` for every target parameter (zeros where the spec says so)."""
        p = self.problem
        if p is None:
            raise ValueError(f"{self.name}: call prepare() before apply()")
        return transport(tau_a, target_spec=p.target_spec, target_shapes=p.target_shapes, layer_map=p.layer_map,
                         maps=self.maps(), depth_scale=self.depth_scale)


@register("bico", human_name="BiCo (bilinear coordinate alignment)",
          description="R_in by Procrustes on input activations, R_out on output gradients; tau_B = R_out^T tau_A R_in",
          reference="Son, Jung, Park, Baik. Bilinear Coordinate Alignment for Training-Free Task-Vector Transfer. "
                    "arXiv:2605.28444 (2026)")
def _bico(**options) -> ProcrustesTransfer:
    return ProcrustesTransfer(**{"in_map": "act", "out_map": "grad", "name": "bico", **options})


@register("activation_only", human_name="Activation-only alignment (Theseus-like)",
          description="both maps by Procrustes on activations: R_in on inputs, R_out on outputs (forward only)",
          reference="Rinaldi, Panariello, Salici, Porrello, Calderara. Theseus. arXiv:2602.12952 (ICML 2026)")
def _activation_only(**options) -> ProcrustesTransfer:
    return ProcrustesTransfer(**{"in_map": "act", "out_map": "act", "name": "activation_only", **options})


@register("gradient_only", human_name="Gradient-only alignment",
          description="R_out on output gradients, R_in on input-side gradients dL/dx (pad/truncate where none exists)",
          reference="Ablation of BiCo, arXiv:2605.28444; input-gradient variant as in the third-party "
                    "merge-and-rebase reimplementation")
def _gradient_only(**options) -> ProcrustesTransfer:
    return ProcrustesTransfer(**{"in_map": "grad_in", "out_map": "grad", "name": "gradient_only", **options})
