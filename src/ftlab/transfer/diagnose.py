"""Before trusting a transfer: how well do the two bases align, layer by layer, and how much of the
task vector should carry over?

:func:`diagnose` runs the calibration pass of a transfer with second moments on and reports, for
every target layer (capture point): the linear CKA of A's and B's rows on the input side (input
activations) and on the output side (output gradients, for BiCo), the Procrustes similarity of each
side, the rank of each map against the dimensions it has to fix (and how many the completion rule
filled), and the layer's share of the task vector. From those it estimates the share of the task
vector that will carry over (``estimate``).

The estimator (ftlab's, a heuristic to be validated by ranking real transfers; it is not from the
BiCo paper). For a layer ``l`` with rows ``X_A, X_B`` on one side, the *Procrustes similarity*

    rho = ||X_A^T X_B||_* / (||X_A||_F ||X_B||_F)   (in [0, 1])

is the cosine between B's rows and A's rows under the best (semi-)orthogonal map, the map BiCo
fits: 1 when B's rows are an exact isometric re-coding of A's, near 0 when they share nothing. A
layer's delta ``tau = sum_n g_n x_n^T`` is carried through both maps, so the layer's carried share
is estimated as ``c_l = rho_in rho_out`` (``rho_out`` alone for layers with only an output map:
norms, embeddings). The estimate weighs layers by their share of the task vector as seen by B:

    estimate = sum_l ||tau_A -> l||^2 c_l / (sum_l ||tau_A -> l||^2 + ||tau_A -> zeroed||^2)

where ``tau_A -> l`` is the part of ``tau_A`` that B's layer ``l`` receives (a source layer feeding
two target layers counts twice) and ``tau_A -> zeroed`` the part B's zeroed parameters would
receive (position embeddings and the like: not carried). ``estimate_cka`` is the same with linear
CKA in place of ``rho``. Both are 1 for an exact re-coding of the source (a permuted copy).

**A low estimate, said before writing** (ftlab's rule, not the BiCo paper's; :func:`expectation`). A transfer whose
``estimate`` is below a threshold has most of its task vector in layers the two bases align poorly;
:meth:`Expectation.message` says so in one line and names the layers that carry the most of the task vector with
the least alignment, and :meth:`Expectation.record` is the JSON form (``ftlab transfer`` writes it into
``report.json`` as ``diagnostic``). The rule was first meant to predict a transfer at ``alpha = 1`` scoring *below
the target's own accuracy*; ftlab's transfer benchmark measured that prediction on every recorded cell (AUROC of the
estimate against "below the target's own accuracy", with a bootstrap interval, and the operating point a warning
would need: at most 20% false alarms and at least 80% hits; docs/transfer-benchmark.md, "Can the diagnostic tell a
harmful transfer?") and found it **not** able to tell harmful transfers from helpful ones on the real pairs (AUROC
near one half, no operating point). So the estimate is reported as an estimate of alignment, never as a prediction
of accuracy: a high estimate does not make a transfer safe, and every transfer should be checked against the
target's own accuracy on held-out data. The library's threshold, :data:`BELOW_TARGET_ESTIMATE` = 0.5, was fixed
before any recorded run (below one half: most of the task vector is in poorly aligned layers); :func:`fit_threshold`
is the benchmark's tool for scoring thresholds.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from torch import nn

from ftlab.transfer.api import fit_maps, layer_records
from ftlab.transfer.methods import Method
from ftlab.transfer.options import TransferOptions

__all__ = ["BELOW_TARGET_ESTIMATE", "RULE_BASIS", "Diagnosis", "Expectation", "diagnose", "diagnosis_from_result",
           "expectation", "fit_threshold"]

#: Below this estimated carried share the estimate is called low (ftlab's rule, fixed before any recorded run; the
#: benchmark found the estimate unable to predict accuracy on real pairs: see the module docstring).
BELOW_TARGET_ESTIMATE = 0.5

#: What the estimate rests on and what it does not tell, said with it (the rule sees the fit, not the task).
RULE_BASIS = ("ftlab's estimate from this fit's layer alignment, not a measurement on the task; on ftlab's transfer "
              "benchmark it did not tell transfers below the target's own accuracy from those above, so check the "
              "transfer against the target's own accuracy on held-out data")


def _num(x) -> float:
    return float(x) if x is not None and math.isfinite(float(x)) else math.nan


@dataclass(frozen=True)
class Diagnosis:
    """Per-layer alignment of two bases and the estimated share of a task vector that carries over.

    ``layers``: one dict per target layer (keys ``target``, ``source``, ``tau_share``, ``in_cka``,
    ``out_cka``, ``in_similarity``, ``out_similarity``, ``in_rank``, ``in_dims``, ``out_rank``,
    ``out_dims``, ``in_statistic``, ``out_statistic``, ``carry``, ``carry_cka``, ``skipped``: no nonzero block of
    the task vector passes through the layer, so its maps were not fitted); ``estimate`` and
    ``estimate_cka`` (see the module docstring); ``zeroed_share``: the share of the task vector (as
    seen by B) in zeroed parameters.
    """

    layers: list[dict]
    estimate: float
    estimate_cka: float
    zeroed_share: float
    method: str
    n_batches: int
    options: dict = field(default_factory=dict)
    time_s: float = 0.0

    def table(self):
        """The per-layer records as a :class:`pandas.DataFrame`."""
        import pandas as pd

        return pd.DataFrame(self.layers)

    def report(self) -> dict:
        """A JSON-ready summary (the CLI writes it as ``diagnosis.json``)."""
        return {"method": self.method, "n_batches": self.n_batches, "estimate": self.estimate,
                "estimate_cka": self.estimate_cka, "zeroed_share": self.zeroed_share, "time_s": self.time_s,
                "options": self.options, "layers": self.layers}

    def summary(self, top: int = 10) -> str:
        """A few lines for a terminal: the estimate and the worst-aligned layers by task-vector share."""
        lines = [f"estimated share of the task vector that carries over: {self.estimate:.3f} "
                 f"(with CKA: {self.estimate_cka:.3f}; zeroed: {self.zeroed_share:.3f}) over {len(self.layers)} layers"]
        worst = sorted(self.layers, key=lambda r: -(r["tau_share"] * (1 - (r["carry"] if math.isfinite(r["carry"])
                                                                            else 0.0))))[:top]
        lines.append("layers losing the most (share of tau, carry, CKA in/out, rank in/out):")
        for r in worst:
            rk = (f"{r['in_rank']}/{r['in_dims']}" if r["in_dims"] else "-") + " " + \
                (f"{r['out_rank']}/{r['out_dims']}" if r["out_dims"] else "-")
            lines.append(f"  {r['target']}: {r['tau_share']:.3f}, carry {r['carry']:.3f}, CKA {r['in_cka']:.3f}/"
                         f"{r['out_cka']:.3f}, rank {rk}")
        return "\n".join(lines)


def diagnose(source_base: nn.Module, source_finetuned: nn.Module, target_base: nn.Module,
             batches: Iterable | None = None, loss: Callable | None = None, *, method: str | Method = "bico",
             options: TransferOptions | None = None, source_batches: Iterable | None = None,
             target_batches: Iterable | None = None, cka: bool = True, head_batches: Iterable | None = None
             ) -> Diagnosis:
    """Layer-by-layer alignment of A and B on the calibration data and the estimated carried share of ``tau_A``.

    Arguments as :func:`~ftlab.transfer.fit_transfer` (the method must fit Procrustes maps; BiCo by
    default). ``estimate`` needs only the fit's own statistics (the Procrustes similarity is read off
    the cross-covariance's singular values and the rows' squared norms): this runs the transfer's
    calibration pass and solves (:func:`~ftlab.transfer.api.fit_maps`) but neither carries ``tau_A`` over nor
    repairs norm statistics, so it costs at most what the transfer costs; the result equals
    :func:`diagnosis_from_result` of that transfer. Layers through which no nonzero block of ``tau_A`` passes
    are skipped as in the transfer (``skipped`` True, nan alignment, share 0; ``options.all_maps`` fits them).
    With ``cka=False`` ``estimate_cka`` and the CKA columns are nan; ``cka=True`` adds second moments
    (``diagnostics=True``), about twice the statistics of a plain transfer. ``head_batches``: B's labelled head
    batches, as in the transfer (the calibration head shapes the gradients). See the module docstring for the
    estimator.
    """
    opts = options if options is not None else TransferOptions()
    if cka:
        opts = dataclasses.replace(opts, diagnostics=True)
    f = fit_maps(source_base, source_finetuned, target_base, batches, loss, method=method, options=opts,
                 source_batches=source_batches, target_batches=target_batches, repair=False, head_batches=head_batches)
    pairs = dict(f.problem.pairs or {})
    records = layer_records(pairs, f.fitted.fits, f.point_norms(), f.problem.skip)
    return _diagnosis(records, f.source_norms().get("zeroed", 0.0), method=f.method.name, n_batches=f.n_batches,
                      options=f.record, time_s=time.perf_counter() - f.t0)


def diagnosis_from_result(res) -> Diagnosis:
    """The estimator of :func:`diagnose` applied to a finished fit (a :class:`~ftlab.transfer.TransferResult`
    fitted with ``diagnostics=True``), without a second calibration pass."""
    return _diagnosis(res.layers(), res.source_norms.get("zeroed", 0.0), method=res.method, n_batches=res.n_batches,
                      options=res.options, time_s=res.time_s)


def _diagnosis(records: list[dict], zeroed_norm: float, *, method: str, n_batches: int, options: dict,
               time_s: float) -> Diagnosis:
    """The estimator over per-layer records (:func:`~ftlab.transfer.api.layer_records`); ``zeroed_norm``: the norm
    of the part of ``tau_A`` that B's zeroed parameters would receive."""
    if not records:
        raise ValueError(f"method {method!r} fits no maps: diagnose needs a Procrustes method such as bico")
    zeroed = zeroed_norm ** 2
    rows = []
    for rec in records:
        w = rec.get("source_norm", 0.0) ** 2
        sims = [_num(rec.get(f"{s}_similarity")) for s in ("in", "out") if f"{s}_map" in rec]
        ckas = [_num(rec.get(f"{s}_cka")) for s in ("in", "out") if f"{s}_map" in rec]
        carry = math.prod(0.0 if not math.isfinite(x) else x for x in sims) if sims else math.nan
        carry_cka = (math.prod(0.0 if not math.isfinite(x) else x for x in ckas)
                     if any(math.isfinite(x) for x in ckas) else math.nan)  # nan: no second moments were gathered
        rows.append({"target": rec["target"], "source": rec["source"], "tau_sq": w,
                     "in_statistic": rec.get("in_source"), "out_statistic": rec.get("out_source"),
                     "in_cka": _num(rec.get("in_cka")), "out_cka": _num(rec.get("out_cka")),
                     "in_similarity": _num(rec.get("in_similarity")), "out_similarity": _num(rec.get("out_similarity")),
                     "in_rank": rec.get("in_rank"), "in_dims": rec.get("in_dims"), "out_rank": rec.get("out_rank"),
                     "out_dims": rec.get("out_dims"), "in_completed": rec.get("in_completed"),
                     "out_completed": rec.get("out_completed"), "carry": carry, "carry_cka": carry_cka,
                     "skipped": bool(rec.get("skipped", False))})
    total = sum(r["tau_sq"] for r in rows) + zeroed
    for r in rows:
        r["tau_share"] = r["tau_sq"] / total if total > 0 else math.nan
    est = sum(r["tau_share"] * r["carry"] for r in rows if math.isfinite(r["carry"])) if total > 0 else math.nan
    cka_rows = [r for r in rows if math.isfinite(r["carry_cka"])]
    est_cka = sum(r["tau_share"] * r["carry_cka"] for r in cka_rows) if total > 0 and cka_rows else math.nan
    return Diagnosis(layers=rows, estimate=est, estimate_cka=est_cka, zeroed_share=zeroed / total if total > 0 else math.nan,
                     method=method, n_batches=n_batches, options=options, time_s=time_s)


@dataclass(frozen=True)
class Expectation:
    """ftlab's rule on a fit's alignment: ``below`` (True: ``estimate`` is below ``threshold``, a *low* estimate; not
    a prediction of accuracy, see the module docstring); ``layers``: the target layers losing the most of the task
    vector (share of ``tau`` times one minus its carried share), most first."""

    below: bool
    estimate: float
    threshold: float
    layers: tuple[str, ...] = ()

    def message(self) -> str:
        """One line for a terminal: the estimate against the threshold, where alignment is worst, what it rests on."""
        where = f"; least aligned where the task vector sits: {', '.join(self.layers)}" if self.layers else ""
        if self.below:
            return (f"note: low estimated carried share {self.estimate:.2f} < {self.threshold:.2f}: most of the task "
                    f"vector sits in layers the two bases align poorly{where} ({RULE_BASIS})")
        return f"estimated carried share {self.estimate:.2f} >= {self.threshold:.2f} ({RULE_BASIS})"

    def record(self) -> dict:
        """JSON-ready: ``estimate``, ``threshold``, ``low_estimate`` (``estimate < threshold``; not a prediction of
        accuracy), ``least_aligned`` (target layers) and ``based_on``."""
        return {"estimate": self.estimate, "threshold": self.threshold, "low_estimate": self.below,
                "least_aligned": list(self.layers), "based_on": RULE_BASIS}


def expectation(diagnosis, *, threshold: float = BELOW_TARGET_ESTIMATE, top: int = 3) -> Expectation:
    """ftlab's rule applied to a :class:`Diagnosis` or to a finished :class:`~ftlab.transfer.TransferResult` of a
    Procrustes method (its statistics carry the similarities the estimate needs; no second pass)."""
    d = diagnosis if isinstance(diagnosis, Diagnosis) else diagnosis_from_result(diagnosis)
    if not math.isfinite(d.estimate):
        raise ValueError(f"estimate={d.estimate!r}: the diagnosis holds no finite estimate of the carried share")
    losing = sorted((r for r in d.layers if math.isfinite(r.get("tau_share", math.nan))),
                    key=lambda r: -(r["tau_share"] * (1 - (r["carry"] if math.isfinite(r["carry"]) else 0.0))))
    return Expectation(bool(d.estimate < threshold), float(d.estimate), float(threshold),
                       tuple(r["target"] for r in losing[:top]))


def fit_threshold(estimates, below) -> tuple[float, int]:
    """The threshold ``t`` for "below when ``estimate < t``" that misclassifies the fewest cells, and that number.

    ``estimates``: finite estimates; ``below``: whether each cell scored below the target's own accuracy. Candidates
    are the midpoints between consecutive distinct estimates (and the ends); among equally good ones the median is
    taken."""
    import numpy as np

    e = np.asarray(estimates, dtype=np.float64)
    b = np.asarray(below, dtype=bool)
    if e.shape != b.shape or e.ndim != 1 or e.size == 0:
        raise ValueError(f"estimates and below must be non-empty 1-d arrays of one length, got {e.shape} and {b.shape}")
    if not np.isfinite(e).all():
        raise ValueError("estimates must be finite")
    u = np.unique(e)
    cand = np.concatenate([[u[0] - 1e-9], (u[1:] + u[:-1]) / 2, [u[-1] + 1e-9]])
    errors = np.array([int(np.sum(b & (e >= t)) + np.sum(~b & (e < t))) for t in cand])
    best = np.flatnonzero(errors == errors.min())
    return float(cand[best[len(best) // 2]]), int(errors.min())
