"""Procrustes-map methods: BiCo, the paper's one-sided ablations, and one-signal variants.

All of them fit, per capture point, an input map ``R_in`` and an output map ``R_out`` (orthogonal
Procrustes, :func:`ftlab.transfer.align.fit_map`, or the pad/truncate map where a side is not
fitted) and transport ``tau_B = R_out^T tau_A R_in``. They differ only in the statistics each map is
fitted on (:class:`ProcrustesOptions` ``in_map`` / ``out_map``):

=====================  ====================  =====================  ==========================================
method                 ``in_map``            ``out_map``            what it is
=====================  ====================  =====================  ==========================================
``bico``               ``act`` (inputs)      ``grad`` (dL/d out)    BiCo (Son et al. 2026, arXiv 2605.28444)
``bico_input_only``    ``act``               ``naive``              the paper's input-side-only ablation
``bico_output_only``   ``naive``             ``grad``               the paper's output-side-only ablation
``activation_only``    ``act``               ``act`` (outputs)      one signal, both sides (Theseus-like,
                                                                    arXiv 2602.12952); forward passes only
``gradient_only``      ``grad_in`` (dL/dx)   ``grad``               one signal, both sides (the
                                                                    ``bico_gradin`` variant of the public
                                                                    ``apanariello4/merge-and-rebase`` code)
=====================  ====================  =====================  ==========================================

Where no input gradient exists (the input is data) ``gradient_only`` falls back to its completion
rule, with a warning. Every method accepts ``in_map``/``out_map`` overrides for the full ablation
grid. Embedding inputs (the vocabulary) are always mapped by identity (or a vocabulary index map);
norm layers only use ``R_out``; a depthwise convolution has one channel map, fitted on its input-
and output-side statistics together (each scaled to unit Frobenius norm, then summed; ftlab's
choice), so that its kernel stays depthwise.

Undetermined subspaces (``complete``; see :mod:`ftlab.transfer.align`). ``"auto"`` (default):
a map fitted on gradients is completed with the activations of the *same* space (an output map
with the output activations of its layer, an input map on input gradients with the input
activations), then with the pad/truncate map; a map fitted on activations is completed with the
pad/truncate map. ``"naive"``: the pad/truncate map only. ``"none"``: the SVD's arbitrary choice
(the behaviour before ftlab 0.x; no rule). Output activations of affine layers are derived from
their input activations, so the rule costs no calibration work there.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from ftlab.core.geometry import cka_from_moments
from ftlab.core.stats import CrossMoments, RowMoments
from ftlab.core.validate import check_bool, check_choice, check_positive, check_range
from ftlab.transfer.align import MapFit, RankWarning, SumMoments, fit_map, naive_map, procrustes_similarity
from ftlab.transfer.methods.registry import Calibration, Requirements, Statistics, register
from ftlab.transfer.problem import TransferProblem
from ftlab.transfer.spec import Point
from ftlab.transfer.task_vector import TaskVector
from ftlab.transfer.transport import carried_points, transport

__all__ = ["IN_MAPS", "OUT_MAPS", "FittedMaps", "ProcrustesOptions", "ProcrustesTransfer", "completion_chain"]

InMap = Literal["act", "grad_in", "naive"]
OutMap = Literal["grad", "act", "naive"]
IN_MAPS: tuple[str, ...] = ("act", "grad_in", "naive")
OUT_MAPS: tuple[str, ...] = ("grad", "act", "naive")


@dataclass(frozen=True)
class ProcrustesOptions:
    """Settings of a Procrustes-map method."""

    in_map: InMap = field(default="act", metadata={"help": "statistic of R_in: act (input activations), grad_in "
                                                            "(input gradients) or naive (pad/truncate)"})
    out_map: OutMap = field(default="grad", metadata={"help": "statistic of R_out: grad (output gradients), act "
                                                               "(output activations) or naive"})
    center: bool = field(default=False, metadata={"help": "centre rows before the cross-covariances [U] (default off)"})
    whiten_p: float = field(default=0.0, metadata={"help": "partial whitening exponent in [0, 0.5] [U] (0 = off)"})
    eps: float = field(default=1e-8, metadata={"help": "relative eigenvalue floor for whitening"})
    complete: Literal["auto", "naive", "none"] = field(default="auto", metadata={
        "help": "rule for the subspace the statistics do not determine: auto (activations of the same space, "
                "then pad/truncate), naive (pad/truncate) or none (the SVD's arbitrary choice)"})
    rank_rtol: float | None = field(default=None, metadata={
        "help": "relative singular-value tolerance of the rank (default: max(d_A, d_B) x the precision's epsilon)"})
    solver: Literal["auto", "dense", "factored"] = field(default="auto", metadata={
        "help": "auto (factored for maps at least 256 wide fitted from fewer rows than their width, dense otherwise), "
                "dense (SVDs of the full cross-covariances) or factored (from kept rows, in the cost of the rank)"})

    def __post_init__(self) -> None:
        check_choice("in_map", self.in_map, IN_MAPS)
        check_choice("out_map", self.out_map, OUT_MAPS)
        check_choice("complete", self.complete, ("auto", "naive", "none"))
        check_choice("solver", self.solver, ("auto", "dense", "factored"))
        if self.rank_rtol is not None:
            check_range("rank_rtol", self.rank_rtol, 0.0, 1.0)
        check_bool("center", self.center)
        check_range("whiten_p", self.whiten_p, 0.0, 0.5)
        check_positive("eps", self.eps)


def _primary(options: ProcrustesOptions, point: Point) -> dict[str, str | None]:
    """The statistic each side's map is fitted on (None: the pad/truncate map, or no input map)."""
    inside = None if not point.layer_kind.has_input_map or options.in_map == "naive" else options.in_map
    return {"in": inside, "out": None if options.out_map == "naive" else options.out_map}


def completion_chain(options: ProcrustesOptions, side: str, primary: str | None, point: Point) -> tuple[str, ...]:
    """The completion chain of one map side (statistic names; ``"naive"`` = the pad/truncate map)."""
    c = options.complete
    if c == "none" or primary is None:
        return ()
    if c == "naive" or point.layer_kind.one_channel_map:
        return ("naive",)
    if (side, primary) in (("out", "grad"), ("in", "grad_in")):
        return ("act", "naive")
    return ("naive",)


@dataclass(frozen=True)
class FittedMaps:
    """Fitted Procrustes maps per target point; :meth:`apply` carries a source task vector onto the target.

    ``fits[target point] = (fit_in, fit_out)`` (:class:`~ftlab.transfer.align.MapFit`, or None where a
    side is not fitted: the pad/truncate map is used there, or no input map for embeddings); the points of
    ``problem.skip`` have no entry (no nonzero block of the fitted task vector passes through them).
    ``n_solves``: the Procrustes solves done (solves on the same statistics counted once).
    """

    problem: TransferProblem
    fits: Mapping[str, tuple[MapFit | None, MapFit | None]]
    n_solves: int = 0

    def maps(self) -> dict[str, tuple[torch.Tensor | None, torch.Tensor]]:
        """``{target_point: (R_in, R_out)}`` (float64); naive or identity where a side was not fitted."""
        p = self.problem
        assert p.pairs is not None and p.target_spec is not None and p.source_spec is not None
        out: dict[str, tuple[torch.Tensor | None, torch.Tensor]] = {}
        for tp, sp in p.pairs.items():
            if tp in p.skip:
                continue
            pt_b, pt_a = p.target_spec.points[tp], p.source_spec.points[sp]
            f_in, f_out = self.fits[tp]
            R_in: torch.Tensor | None
            if not pt_b.layer_kind.has_input_map:
                R_in = None  # a vocabulary, or a per-channel layer: its rules read R_out only (no d x d identity)
            else:
                R_in = f_in.R if f_in is not None else naive_map(pt_a.in_dim, pt_b.in_dim)
            R_out = f_out.R if f_out is not None else naive_map(pt_a.out_dim, pt_b.out_dim)
            out[tp] = (R_in, R_out)
        return out

    def apply(self, tau_a: TaskVector) -> TaskVector:
        """``tau_B = R_out^T tau_A R_in`` for every target parameter (zeros where the spec says so).

        ``ValueError`` when ``tau_a`` carries a nonzero block through a point whose maps were skipped."""
        p = self.problem
        assert p.target_spec is not None
        if p.skip:
            needs = sorted(carried_points(p.target_spec, p.layer_map, tau_a) & p.skip)
            if needs:
                raise ValueError(f"this task vector is nonzero through target layer {needs[0]!r}, whose maps the fit "
                                 "skipped (the fitted task vector is zero there); fit with all_maps=True to carry "
                                 "other task vectors with the same maps")
        return transport(tau_a, target_spec=p.target_spec, target_shapes=p.target_shapes, layer_map=p.layer_map,
                         maps=self.maps(), vocab_maps=p.vocab_maps)


class ProcrustesTransfer:
    """Fit ``R_in``/``R_out`` per point from streamed cross-covariances, then transport (see the module table)."""

    calibration: Calibration = "maps"

    def __init__(self, options: ProcrustesOptions | None = None, *, name: str = "bico"):
        self.options = options if options is not None else ProcrustesOptions()
        self.name = name

    def requirements(self, point: Point) -> Requirements:
        """Statistics to collect on each side of ``point``: ``{"in": (...), "out": (...)}``, the fitted one first.

        The others feed the completion rule.
        """
        prim = _primary(self.options, point)
        out: dict[str, list[str]] = {"in": [], "out": []}
        for side in ("in", "out"):
            p = prim[side]
            if p is not None:
                out[side].append(p)
            for src in completion_chain(self.options, side, p, point):
                if src != "naive" and src not in out[side]:
                    out[side].append(src)
        return {k: tuple(v) for k, v in out.items()}

    @property
    def needs_loss(self) -> bool:
        return self.options.in_map == "grad_in" or self.options.out_map == "grad"

    @property
    def needs_second_moments(self) -> bool:
        return self.options.whiten_p > 0

    def check(self, tau_a: TaskVector, problem: TransferProblem) -> None:
        """Nothing to check before calibration (shapes may differ)."""

    def _fit_kw(self) -> dict:
        o = self.options
        return {"center": o.center, "whiten_p": o.whiten_p, "eps": o.eps, "rank_rtol": o.rank_rtol, "solver": o.solver}

    def solves(self, tp: str, point: Point, stats) -> list[tuple[str, Any, tuple, str, str]]:
        """The solves of one point: ``(side, statistics, completion chain, source label, name)``."""
        o, prim = self.options, _primary(self.options, point)
        if point.layer_kind.one_channel_map:  # one map for both sides, so a depthwise kernel stays depthwise
            parts = [stats[(tp, side, prim[side])] for side in ("in", "out") if prim[side] is not None]
            if not parts:
                return []
            label = "+".join(f"{side}:{prim[side]}" for side in ("in", "out") if prim[side] is not None)
            chain: tuple = (("naive", None),) if o.complete != "none" else ()
            return [("channels", parts[0] if len(parts) == 1 else SumMoments(parts), chain, label, f"{tp} (channels)")]
        jobs = []
        for side in ("in", "out"):
            src = prim[side]
            if src is not None:
                chain = tuple((c, None if c == "naive" else stats[(tp, side, c)])
                              for c in completion_chain(o, side, src, point))
                jobs.append((side, stats[(tp, side, src)], chain, src, f"{tp} ({side})"))
        return jobs

    def _depthwise_pair(self, fit: MapFit, parts) -> tuple[MapFit, MapFit]:
        """One shared channel map; each side reports the alignment of its own statistic."""
        sides = []
        for part in parts:
            diag = isinstance(part, (CrossMoments, RowMoments)) and part.second
            sides.append(dataclasses.replace(
                fit, similarity=procrustes_similarity(part, self.options.center) if diag else math.nan,
                cka=cka_from_moments(part) if diag else math.nan))
        return sides[0], sides[1]

    def prepare(self, problem: TransferProblem, stats: Statistics) -> FittedMaps:
        """Fit the maps from ``stats[(target_point, side, statistic)]`` (:mod:`ftlab.transfer.calibrate`).

        Solves that read the same statistics (the inputs of q, k and v) are done once; the solves run
        in parallel on the intra-op threads torch has (each single-threaded); the maps whose statistics
        leave dimensions undetermined are summarised in one :class:`~ftlab.transfer.align.RankWarning`.
        """
        if problem.pairs is None or problem.target_spec is None:
            raise RuntimeError(f"{self.name}: the transfer problem has no paired capture points")
        if not isinstance(stats, Mapping):
            raise TypeError(f"{self.name}: prepare needs the calibration statistics (a mapping), got {type(stats).__name__}")
        jobs = {tp: self.solves(tp, problem.target_spec.points[tp], stats) for tp in problem.pairs
                if tp not in problem.skip}
        del stats  # from here on each statistic is held by its solves only, and freed when they are done
        queue = [(st, chain, label, name) for js in jobs.values() for _, st, chain, label, name in js]
        layout = {tp: [(side, name, st.parts if isinstance(st, SumMoments) else None) for side, st, _, _, name in js]
                  for tp, js in jobs.items()}
        del jobs
        solved, n_solves = solve_all(queue, self._fit_kw())
        fits: dict[str, tuple[MapFit | None, MapFit | None]] = {}
        for tp, js in layout.items():
            got = {side: solved[name] for side, name, _ in js}
            if "channels" in got:
                parts = js[0][2]
                fits[tp] = self._depthwise_pair(got["channels"], parts) if parts is not None else \
                    (got["channels"], got["channels"])
            else:
                fits[tp] = (got.get("in"), got.get("out"))
        warn_rank([f for pair in fits.values() for f in {id(x): x for x in pair if x is not None}.values()])
        return FittedMaps(problem, fits, n_solves)


def solve_all(jobs: list[tuple[Any, tuple, str, str]], kw: dict) -> tuple[dict[str, MapFit], int]:
    """``{name: fit}`` for ``(statistics, chain, source label, name)`` jobs, and the number of solves: jobs on the
    same statistics and chain share one solve. Solves run in a pool of ``torch.get_num_threads()`` workers, torch
    single-threaded inside (LAPACK releases the GIL); results do not depend on the number of workers. ``jobs`` is
    emptied: a statistic held by nothing else is freed once its solve is done."""
    import concurrent.futures as cf

    from ftlab.core.progress import progress
    from ftlab.core.validate import trim_memory

    unique: dict[tuple, list[tuple[str, str]]] = {}
    args: dict[tuple, tuple] = {}
    while jobs:
        st, chain, label, name = jobs.pop()
        key = (id(st), tuple((lab, id(c)) for lab, c in chain), label)
        unique.setdefault(key, []).append((name, label))
        args.setdefault(key, (st, chain, label, name))
    threads = torch.get_num_threads()
    out: dict[str, MapFit] = {}
    torch.set_num_threads(1)
    try:
        with cf.ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            futures = {pool.submit(fit_map, a[0], source=a[2], completion=a[1], name=a[3], **kw): key
                       for key, a in args.items()}
            args.clear()
            for fut in progress(cf.as_completed(futures), desc="solves", total=len(futures)):
                fit = fut.result()
                trim_memory()  # each dense solve frees its workspace: give it back (bounds the peak)
                for name, _ in unique[futures[fut]]:
                    out[name] = fit if name == fit.name else dataclasses.replace(fit, name=name)
    finally:
        torch.set_num_threads(threads)
    return out, len(unique)


def warn_rank(fits: list[MapFit], top: int = 3) -> None:
    """One :class:`~ftlab.transfer.align.RankWarning` for all maps the statistics do not fully determine: how many,
    and the notes of the ``top`` least determined (every fit keeps its own note: ``MapFit.note``)."""
    notes = [(1.0 - f.rank / f.dims if f.dims else 1.0, f.note) for f in fits if f.note]
    if not notes:
        return
    worst = "; ".join(n for _, n in sorted(notes, key=lambda x: -x[0])[:top])
    warnings.warn(f"{len(notes)} of {len(fits)} maps are determined on fewer dimensions than their width (the "
                  f"completion rule fixes the rest; each fit's note and the report's layers say how); least determined: "
                  f"{worst}", RankWarning, stacklevel=3)


_BICO = "Son, Jung, Park, Baik. Bilinear Coordinate Alignment for Training-Free Task-Vector Transfer. arXiv:2605.28444"
_NEEDS_LOSS = "calibration inputs, labels and a loss(model, batch)"

register("bico", human_name="BiCo (bilinear coordinate alignment)",
         description="R_in by Procrustes on input activations, R_out on output gradients; tau_B = R_out^T tau_A R_in",
         reference=_BICO, needs=_NEEDS_LOSS, options=ProcrustesOptions,
         preset={"in_map": "act", "out_map": "grad"})(ProcrustesTransfer)
register("bico_input_only", human_name="BiCo ablation: input side only",
         description="R_in by Procrustes on input activations; output side by the pad/truncate map",
         reference=f"ablation in {_BICO}", needs="calibration inputs (forward passes only)", options=ProcrustesOptions,
         preset={"in_map": "act", "out_map": "naive"})(ProcrustesTransfer)
register("bico_output_only", human_name="BiCo ablation: output side only",
         description="R_out by Procrustes on output gradients; input side by the pad/truncate map",
         reference=f"ablation in {_BICO}", needs=_NEEDS_LOSS, options=ProcrustesOptions,
         preset={"in_map": "naive", "out_map": "grad"})(ProcrustesTransfer)
register("activation_only", human_name="Activations on both sides (Theseus-like)",
         description="R_in on input activations and R_out on output activations (forward passes only: no labels, "
                     "no loss)",
         reference="Rinaldi, Panariello, Salici, Porrello, Calderara. Theseus. arXiv:2602.12952",
         needs="calibration inputs (forward passes only)", options=ProcrustesOptions,
         preset={"in_map": "act", "out_map": "act"})(ProcrustesTransfer)
register("gradient_only", human_name="Gradients on both sides",
         description="R_out on output gradients, R_in on input gradients dL/dx (pad/truncate where none exists)",
         reference="the bico_gradin variant of github.com/apanariello4/merge-and-rebase", needs=_NEEDS_LOSS,
         options=ProcrustesOptions, preset={"in_map": "grad_in", "out_map": "grad"})(ProcrustesTransfer)
