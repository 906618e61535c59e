"""The paper's five deep-network claims: one primary test each, declared here before any run, then
secondary rows and ftlab's own findings, all judged with :mod:`ftlab.experiments.verdicts`.

Claims of Anguita et al. (2026, arXiv 2602.20062) as this project states them:

1. decreasing the relative scale of the early layers (the analogue of lambda_PT < 0) improves
   fine-tuning generalization;
2. decreasing the absolute scale (c_PT) degrades it;
3. decreasing the readout re-initialization scale (gamma_FT) improves it at intermediate sample sizes;
4. successful interventions give a "rich and pretraining-dependent" signature: the representation
   compresses (lower PR) while staying aligned with the pretrained one (high ENSD);
5. in Transformers on modular arithmetic, lower balancedness (the analogue of a negative relative
   scale) improves generalization, particularly on tasks involving new prime factors.

**Primaries** (:data:`PRIMARIES`, printed by the report): one test per claim, Holm over the five.
Every effect is signed so that positive = the paper's direction and paired per seed (same seed,
task and n_FT; only the knob differs). A primary pools its strata with equal weights per seed (a
stratified paired test, :func:`ftlab.experiments.verdicts.pool_strata`); the strata's own effects,
Cochran's Q and I^2 are reported beside it. Claim 4 is an intersection-union test: among the
interventions that improved accuracy, compression must be significantly positive *and* alignment
no more than :data:`ALIGN_BOUND` below the baseline's.

**Secondary rows** (one per architecture, task and when; their own Holm family) and **ftlab's
own findings** (the opposite knob directions, which the paper does not claim; a third family) have
the same rule. A row or primary whose runs missed the training-loss target in more than
:data:`ftlab.experiments.verdicts.PREMISE_TOLERANCE` of cases is "outside the premise".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ftlab.experiments.verdicts import (
    MIN_SEEDS,
    Evidence,
    judge_claims,
    minimal_detectable_effect,
    pool_strata,
    power,
)

__all__ = ["ACC_MARGIN", "ALIGN_BOUND", "COLUMNS", "GEOMETRY_LAYER", "PAPER", "PR_MARGIN", "PRIMARIES", "Primary",
           "Row", "claims_table", "modular_rows", "paired", "primaries_table", "vision_rows"]

ACC_MARGIN = 0.01  # one accuracy point: margin of practical irrelevance
PR_MARGIN = 0.05  # a 5% change of the participation ratio (log units)
ALIGN_BOUND = -0.05  # claim 4: CKA with the unintervened PT network at most 0.05 below the baseline's
ACC_SE_FLOOR = 0.001  # a tenth of an accuracy point: the floor of a stratum's standard error in Q
POWER_EFFECT = 0.02  # the effect (2 accuracy points) the seeds are chosen to detect with 80% power
GEOMETRY_LAYER = "pool"
PAPER = {
    1: "decreasing the relative scale of the early layers (lambda_PT < 0) improves fine-tuning generalization",
    2: "decreasing the absolute scale c_PT degrades fine-tuning generalization",
    3: "decreasing the readout re-initialization scale gamma_FT improves generalization at intermediate sample sizes",
    4: "successful interventions compress the representation (lower PR) while it stays aligned with the pretrained "
       "one (high ENSD)",
    5: "lower balancedness improves Transformer generalization on modular arithmetic, particularly on tasks with new "
       "prime factors",
}
COLUMNS = ["level", "claim", "paper_statement", "arch", "task", "knob", "when", "effect", "ci_low", "ci_high", "p_holm",
           "seeds", "verdict", "fam_low", "fam_high", "p", "q", "i2", "p_q", "strata", "premise_missed", "runs",
           "pt_train_loss", "ft_train_loss", "sd", "power_2pt", "mde", "margin", "unit", "definition"]


@dataclass(frozen=True)
class Primary:
    """One claim's pre-registered primary test.

    statistic : what is computed per seed; pools : the strata and their weights; direction : what a
    positive effect means; margin : the "no effect" margin (``unit``); requires : claim 4's second
    part; pilot_sd, pilot_n : the per-seed standard deviation of the pooled statistic in the pilot and
    its number of seeds (recorded; docs/deep-pilot.csv)."""

    claim: int
    statistic: str
    pools: str
    direction: str
    margin: float
    unit: str
    pilot_sd: float = math.nan
    pilot_n: int = 0
    requires: str = ""

    def planning_sd(self) -> float:
        """The pilot's standard deviation raised to its one-sided 80% upper confidence bound
        (chi-square on ``pilot_n - 1`` degrees of freedom): a few pilot seeds underestimate it as often
        as not, and seeds chosen from the point estimate would then miss their power half of the time."""
        from scipy import stats

        if self.pilot_n < 2 or not math.isfinite(self.pilot_sd):
            return math.nan
        df = self.pilot_n - 1
        return self.pilot_sd * math.sqrt(df / float(stats.chi2.ppf(0.2, df)))

    def seeds_needed(self) -> int | None:
        """Seeds for 80% power at :data:`POWER_EFFECT` (level 0.05/5, the Bonferroni bound of Holm over the
        five) from :meth:`planning_sd`, at least :data:`ftlab.experiments.verdicts.MIN_SEEDS`; None for
        claim 4 (no accuracy effect to power: its minimal detectable effect is reported) or without a pilot."""
        from ftlab.experiments.verdicts import seeds_for_power

        sd = self.planning_sd()
        if self.unit != "accuracy" or not math.isfinite(sd):
            return None
        return seeds_for_power(POWER_EFFECT, sd, m=len(PAPER), min_n=MIN_SEEDS)


PRIMARIES: tuple[Primary, ...] = (
    Primary(1, "acc(kappa = 0.25 at PT initialization) - acc(kappa = 1), mean over n_FT",
            "6 strata: 2 vision architectures x 3 fine-tuning tasks, equal weights", "positive = kappa < 1 helps",
            ACC_MARGIN, "accuracy", pilot_sd=0.00741, pilot_n=6),
    Primary(2, "acc(s = 1) - acc(s = 0.25 at PT initialization), mean over n_FT",
            "6 strata: 2 vision architectures x 3 fine-tuning tasks, equal weights", "positive = s < 1 hurts",
            ACC_MARGIN, "accuracy", pilot_sd=0.01305, pilot_n=6),
    Primary(3, "acc(gamma < 1) - acc(gamma = 1) for the fresh readout, mean over gamma < 1 and n_FT in {30, 100}",
            "6 strata: 2 vision architectures x 3 fine-tuning tasks, equal weights", "positive = gamma < 1 helps",
            ACC_MARGIN, "accuracy", pilot_sd=0.00124, pilot_n=6),
    Primary(4, "among the interventions that improved accuracy (selected on the other seeds), the compression "
               "-(log PR - log PR of the baseline) of the centred pooled features after fine-tuning, n_FT = 100",
            "6 strata: 2 vision architectures x 3 fine-tuning tasks, equal weights",
            "positive = successful interventions compress", PR_MARGIN, "log PR", pilot_sd=0.0511, pilot_n=6,
            requires=f"and their linear CKA with the unintervened PT network minus the baseline's above "
                     f"{ALIGN_BOUND:g} (intersection-union test)"),
    Primary(5, "acc(b < 0) - acc(b = 0), b set at the start of fine-tuning (after the fresh readout), mean over "
               "b in {-0.9, -0.5}",
            "6 strata: the moduli 3, 5, 10 (factor reuse) and 7, 11, 14 (new prime factors), equal weights",
            "positive = lower balancedness helps", ACC_MARGIN, "accuracy", pilot_sd=0.03433, pilot_n=12),
)


@dataclass(frozen=True)
class Row:
    """One judged effect: its level (``primary``, ``secondary``, ``ftlab``), labels, evidence, the largest
    training losses behind it, and how many of its runs there were."""

    level: str
    claim: int | str
    statement: str
    arch: str
    task: str
    knob: str
    when: str
    definition: str
    evidence: Evidence
    unit: str
    pt_loss: float
    ft_loss: float
    runs: int


def paired(ft: pd.DataFrame, base: Callable[[pd.DataFrame], pd.Series], keys: list[str],
           metric: str = "acc") -> pd.DataFrame:
    """Rows of ``ft`` with ``diff`` = metric minus the reference arm's metric at the same ``keys``;
    ``base(ft)`` selects the reference rows (one per key)."""
    ref = ft[base(ft)].set_index(keys)[metric]
    if ref.index.duplicated().any():
        raise ValueError(f"the reference arm has several rows per {keys}")
    out = ft.copy()
    out["diff"] = out[metric].to_numpy() - ref.reindex(pd.MultiIndex.from_frame(out[keys])).to_numpy()
    return out


# ------------------------------------------------------------------------- runs behind a row
def _max(values) -> float:
    v = np.asarray(pd.to_numeric(pd.Series(values), errors="coerce"), dtype=float)
    return float(np.nanmax(v)) if v.size and np.isfinite(v).any() else math.nan


@dataclass(frozen=True)
class _Runs:
    """The fine-tuning runs behind a selection (the arm's and the reference arm's): how many, how many are
    outside the premise (their fine-tuning or the pretraining they start from missed the loss target),
    and the largest training losses reached."""

    n: int
    missed: int
    pt_loss: float
    ft_loss: float


def _premise(ft: pd.DataFrame, pt: pd.DataFrame | None, pt_keys: list[str],
             pt_arm: Callable[[pd.DataFrame], pd.DataFrame]) -> pd.DataFrame:
    """``ft`` with ``in_premise`` (its fine-tuning and its pretraining reached the loss target) and
    ``pt_loss_behind`` (the reached loss of its pretraining). ``pt_arm(ft)`` gives, per FT row, the
    values of ``pt_keys`` identifying its pretraining run."""
    conv = ft["ft_converged"] if "ft_converged" in ft.columns else pd.Series(True, index=ft.index)
    ok = conv.fillna(False).astype(bool).to_numpy()
    loss = np.full(len(ft), np.nan)
    if pt is not None and not pt.empty:
        want = pt_arm(ft)
        p = pt.assign(_ok=pt.pt_converged.fillna(False).astype(bool))
        p = p.drop_duplicates(pt_keys).set_index(pt_keys)
        idx = pd.MultiIndex.from_frame(want[pt_keys])
        pt_ok = p["_ok"].reindex(idx).fillna(False).to_numpy(dtype=bool)
        ok = ok & pt_ok
        loss = p["pt_loss"].reindex(idx).to_numpy(dtype=float)
    return ft.assign(in_premise=ok, pt_loss_behind=loss)


def _vision_premise(ft: pd.DataFrame, pt: pd.DataFrame | None) -> pd.DataFrame:
    def arm(f: pd.DataFrame) -> pd.DataFrame:
        init = (f.when == "init").to_numpy()
        return pd.DataFrame({"arch": f.arch.to_numpy(), "seed": f.seed.to_numpy(),
                             "knob": np.where(init, f.knob, "none"), "value": np.where(init, f.value, 1.0)})
    return _premise(ft, pt, ["arch", "seed", "knob", "value"], arm)


def _modular_premise(ft: pd.DataFrame, pt: pd.DataFrame | None) -> pd.DataFrame:
    def arm(f: pd.DataFrame) -> pd.DataFrame:
        key = [f"{float(b):g}" if w == "init" else "none" for w, b in zip(f.when, f.b)]
        return pd.DataFrame({"seed": f.seed.to_numpy(), "b_key": key})
    if pt is not None and not pt.empty:
        b = pd.to_numeric(pt.b_init, errors="coerce")
        pt = pt.assign(b_key=["none" if not np.isfinite(v) else f"{v:g}" for v in b])
    return _premise(ft, pt, ["seed", "b_key"], arm)


def _runs(sel: pd.DataFrame, d: pd.DataFrame, keys: list[str], base: pd.Series) -> _Runs:
    idx = pd.MultiIndex.from_frame(sel[keys].drop_duplicates())
    ref = d[base.to_numpy() & pd.MultiIndex.from_frame(d[keys]).isin(idx)]
    both = pd.concat([sel, ref])
    return _Runs(len(both), int((~both.in_premise.astype(bool)).sum()), _max(both.pt_loss_behind), _max(both.ft_loss))


def _vision_runs(sel: pd.DataFrame, d: pd.DataFrame) -> _Runs:
    return _runs(sel, d, ["arch", "seed", "task", "n_ft"], d.knob == "none")


def _modular_runs(sel: pd.DataFrame, d: pd.DataFrame) -> _Runs:
    return _runs(sel, d, ["seed", "p", "when"], d.b == 0.0)


def _row(level: str, claim: int | str, statement: str, arch: str, task: str, knob: str, when: str, definition: str,
         evidence: Evidence, runs: _Runs, unit: str = "accuracy") -> Row:
    ev = Evidence(evidence.values, evidence.margin, evidence.strata, evidence.strata_names, evidence.se_floor,
                  runs.missed / runs.n if runs.n else 0.0, evidence.requires)
    return Row(level, claim, statement, arch, task, knob, when, definition, ev, unit, runs.pt_loss, runs.ft_loss,
               runs.n)


def _strata(sel: pd.DataFrame, by: list[str], sign: float, value: str = "diff") -> tuple[np.ndarray, tuple[str, ...]]:
    """``(n_seeds, n_strata)`` matrix of per-seed mean ``value`` (times ``sign``) per stratum ``by``."""
    m = (sign * sel.groupby(["seed", *by])[value].mean()).unstack(by)
    names = tuple("/".join(map(str, c)) if isinstance(c, tuple) else str(c) for c in m.columns)
    return m.to_numpy(dtype=float), names


def _pooled(sel: pd.DataFrame, by: list[str], sign: float, margin: float = ACC_MARGIN) -> Evidence:
    mat, names = _strata(sel, by, sign)
    return Evidence(pool_strata(mat), margin, mat, names, ACC_SE_FLOOR)


def _single(sel: pd.DataFrame, sign: float, margin: float = ACC_MARGIN) -> Evidence:
    return Evidence((sign * sel.groupby("seed")["diff"].mean()).to_numpy(dtype=float), margin)


# ------------------------------------------------------------------------------------ vision
def _mid(ns: list) -> list:
    return ns[1:-1] if len(ns) >= 3 else ns


def vision_rows(ft: pd.DataFrame, pt: pd.DataFrame | None = None, *, gamma_default: float = 1.0,
                geometry_at: int | None = None) -> list[Row]:
    """Primaries 1-4, their secondary rows and ftlab's own findings from a vision fine-tuning table
    (columns arch, seed, task, n_ft, knob, when, value, acc, ft_loss, ft_converged and, at
    ``geometry_at``, ``pr_post_c:pool`` and ``cka:pool``) and its pretraining table."""
    ft = _vision_premise(ft, pt)
    d = paired(ft, lambda f: f.knob == "none", ["arch", "seed", "task", "n_ft"])
    mid = _mid(sorted(ft.n_ft.unique()))
    k1 = d[(d.knob == "kappa") & (d.when == "init") & (d.value < 1)]
    s2 = d[(d.knob == "s") & (d.value < 1)]
    g3 = d[(d.knob == "gamma") & (d.value < gamma_default) & d.n_ft.isin(mid)]
    rows = []
    for claim, sel, sign, knob, when in ((1, k1, 1.0, "kappa", "init"), (2, s2, -1.0, "s", "init"),
                                         (3, g3, 1.0, "gamma", "ft")):
        if len(sel):
            rows.append(_row("primary", claim, PAPER[claim], "both vision", "all", knob, when,
                             PRIMARIES[claim - 1].statistic, _pooled(sel, ["arch", "task"], sign),
                             _vision_runs(sel, d)))
    rows += _signature_rows(ft, d, geometry_at)
    rows += _vision_secondary(d, gamma_default, mid)
    return rows


def _vision_secondary(d: pd.DataFrame, gamma_default: float, mid: list) -> list[Row]:
    out: list[Row] = []
    own_k = "increasing the relative scale of the early layers (kappa > 1) degrades fine-tuning"
    own_s = "increasing the absolute scale (s > 1) degrades fine-tuning"
    for (arch, task), t in d.groupby(["arch", "task"]):
        specs: list[tuple[str, int | str, str, pd.DataFrame, float, str, str, str]] = []
        for when in ("init", "post"):
            k = t[(t.knob == "kappa") & (t.when == when)]
            specs += [("secondary", 1, PAPER[1], k[k.value < 1], 1.0, "kappa", when,
                       "acc(kappa<1) - acc(kappa=1), mean over n_FT"),
                      ("ftlab", "own", own_k, k[k.value > 1], -1.0, "kappa", when,
                       "acc(kappa=1) - acc(kappa>1), mean over n_FT")]
        s = t[t.knob == "s"]
        specs += [("secondary", 2, PAPER[2], s[s.value < 1], -1.0, "s", "init", "acc(s=1) - acc(s<1), mean over n_FT"),
                  ("ftlab", "own", own_s, s[s.value > 1], -1.0, "s", "init", "acc(s=1) - acc(s>1), mean over n_FT")]
        g = t[(t.knob == "gamma") & (t.value < gamma_default) & t.n_ft.isin(mid)]
        specs.append(("secondary", 3, PAPER[3], g, 1.0, "gamma", "ft",
                      f"acc(gamma<{gamma_default:g}) - acc(gamma={gamma_default:g}), mean over n_FT in "
                      f"{[int(n) for n in mid]}"))
        for level, claim, statement, sel, sign, knob, when, definition in specs:
            if len(sel):
                out.append(_row(level, claim, statement, str(arch), str(task), knob, when, definition,
                                _single(sel, sign), _vision_runs(sel, d)))
    return out


def _signature_cells(ft: pd.DataFrame, geometry_at: int | None) -> pd.DataFrame:
    """Per (arch, task, arm, seed) at the geometry n_FT: accuracy gain, compression -(log PR - log PR of
    the baseline) and alignment (CKA - CKA of the baseline, both with the unintervened PT network)."""
    L = GEOMETRY_LAYER
    pr, cka = f"pr_post_c:{L}", f"cka:{L}"
    if pr not in ft.columns or cka not in ft.columns:
        return pd.DataFrame()
    g = ft[ft[pr].notna() & ft[cka].notna()]
    if geometry_at is not None:
        g = g[g.n_ft == geometry_at]
    if g.empty:
        return pd.DataFrame()
    g = g.assign(log_pr=np.log(g[pr].astype(float)), cka_=g[cka].astype(float))
    keys = ["arch", "seed", "task", "n_ft"]
    d = paired(g, lambda f: f.knob == "none", keys)
    d["comp"] = -paired(g, lambda f: f.knob == "none", keys, "log_pr")["diff"]
    d["align"] = paired(g, lambda f: f.knob == "none", keys, "cka_")["diff"]
    return d[d.knob != "none"]


def _successful(cells: pd.DataFrame) -> pd.DataFrame:
    """The cells whose intervention improved accuracy, judged for each seed on the *other* seeds (mean
    accuracy gain > 0): the selection does not use the seed it is applied to."""
    arm = ["arch", "task", "knob", "when", "value"]
    tot = cells.groupby(arm)["diff"].agg(["sum", "count"])
    j = cells.join(tot, on=arm)
    loo = (j["sum"] - j["diff"]) / (j["count"] - 1).where(j["count"] > 1)
    return cells[(loo > 0).to_numpy()]


def _signature_rows(ft: pd.DataFrame, d: pd.DataFrame, geometry_at: int | None) -> list[Row]:
    cells = _signature_cells(ft, geometry_at)
    if cells.empty:
        return []
    ok = _successful(cells)
    if ok.empty:
        return []
    out = []
    comp, names = _strata(ok, ["arch", "task"], 1.0, "comp")
    align, _ = _strata(ok, ["arch", "task"], 1.0, "align")
    ev = Evidence(pool_strata(comp), PR_MARGIN, comp, names, 0.0, requires=(pool_strata(align), ALIGN_BOUND))
    out.append(_row("primary", 4, PAPER[4], "both vision", "all", "successful arms", "-", PRIMARIES[3].statistic, ev,
                    _vision_runs(ok, d), unit="log PR"))
    for (arch, task), t in ok.groupby(["arch", "task"]):
        c = t.groupby("seed")["comp"].mean()
        a = t.groupby("seed")["align"].mean().reindex(c.index)
        ev = Evidence(c.to_numpy(dtype=float), PR_MARGIN, requires=(a.to_numpy(dtype=float), ALIGN_BOUND))
        out.append(_row("secondary", 4, PAPER[4], str(arch), str(task), "successful arms", "-",
                        "compression of the successful interventions (log PR), with CKA alignment above "
                        f"{ALIGN_BOUND:g}", ev, _vision_runs(t, d), unit="log PR"))
    return out


# ----------------------------------------------------------------------------------- modular
def modular_rows(ft: pd.DataFrame, pt: pd.DataFrame | None = None) -> list[Row]:
    """Primary 5, its secondary rows (per when and task kind; new minus reuse) and ftlab's own finding
    (b > 0 degrades) from a modular fine-tuning table (columns seed, p, kind, when, b, acc, ft_loss,
    ft_converged) and its pretraining table."""
    d = paired(_modular_premise(ft, pt), lambda f: f.b == 0.0, ["seed", "p", "when"])
    out: list[Row] = []
    post = d[(d.when == "post") & (d.b < 0)]
    if len(post):
        out.append(_row("primary", 5, PAPER[5], "transformer", "all moduli", "b", "post", PRIMARIES[4].statistic,
                        _pooled(post, ["p"], 1.0), _modular_runs(post, d)))
    for when in sorted(d.when.unique()):
        t = d[(d.when == when) & (d.b < 0)]
        per = {k: t[t.kind == k] for k in ("new", "reuse")}
        for kind, sel in per.items():
            if len(sel):
                out.append(_row("secondary", 5, PAPER[5], "transformer",
                                "new primes" if kind == "new" else "factor reuse", "b", when,
                                f"acc(b<0) - acc(b=0), mean over b<0 and the {kind} moduli", _single(sel, 1.0),
                                _modular_runs(sel, d)))
        if all(len(v) for v in per.values()):
            diff = (per["new"].groupby("seed")["diff"].mean() - per["reuse"].groupby("seed")["diff"].mean()).dropna()
            out.append(_row("secondary", 5, PAPER[5], "transformer", "new minus reuse", "b", when,
                            "(acc(b<0) - acc(b=0))[new] - (same)[reuse], per seed",
                            Evidence(diff.to_numpy(dtype=float), ACC_MARGIN), _modular_runs(t, d)))
        up = d[(d.when == when) & (d.b > 0)]
        if len(up):
            out.append(_row("ftlab", "own", "higher balancedness (b > 0) degrades Transformer fine-tuning", "transformer",
                            "all moduli", "b", when, "acc(b=0) - acc(b>0), mean over b>0 and the moduli",
                            _single(up, -1.0), _modular_runs(up, d)))
    return out


# ---------------------------------------------------------------------------------- judging
def _judge_level(rows: list[Row]) -> list[dict]:
    js = judge_claims({str(i): r.evidence for i, r in enumerate(rows)})
    out = []
    for r, j in zip(rows, js):
        sd = float(np.std(np.asarray(r.evidence.values, dtype=float), ddof=1)) if j.n >= 2 else math.nan
        m = len(rows)
        het = j.het
        scale = 100.0 if r.unit == "accuracy" else 1.0
        strata = "; ".join(f"{name} {scale * mean:+.{1 if scale == 100 else 3}f}" for name, mean, _, _ in het.strata) \
            if het else ""
        out.append({"level": r.level, "claim": r.claim, "paper_statement": r.statement, "arch": r.arch, "task": r.task,
                    "knob": r.knob, "when": r.when, "effect": j.effect, "ci_low": j.ci_low, "ci_high": j.ci_high,
                    "p_holm": j.p_holm, "seeds": j.n, "verdict": j.verdict, "fam_low": j.fam_low,
                    "fam_high": j.fam_high, "p": j.p, "q": het.q if het else math.nan,
                    "i2": het.i2 if het else math.nan, "p_q": het.p if het else math.nan, "strata": strata,
                    "premise_missed": j.premise_missed, "runs": r.runs, "pt_train_loss": r.pt_loss,
                    "ft_train_loss": r.ft_loss, "sd": sd,
                    "power_2pt": power(POWER_EFFECT, sd, j.n, m=m) if r.unit == "accuracy" else math.nan,
                    "mde": minimal_detectable_effect(sd, j.n, m=m), "margin": j.margin, "unit": r.unit,
                    "definition": r.definition})
    return out


def claims_table(rows: list[Row]) -> pd.DataFrame:
    """Judge ``rows`` level by level (primaries, secondary rows, ftlab's own findings: three Holm families)
    and return them in that order with :data:`COLUMNS`; ``strata`` lists a pooled row's per-stratum effects
    (accuracy points, or log PR); ``sd`` is the per-seed standard deviation of the effect (what a pilot
    records to choose seeds); ``power_2pt`` is the power for a 2-point effect
    and ``mde`` the minimal detectable effect (80% power, level 0.05 over the family), both at the row's
    seeds and its own per-seed standard deviation."""
    out: list[dict] = []
    for level in ("primary", "secondary", "ftlab"):
        mine = [r for r in rows if r.level == level]
        if mine:
            out += _judge_level(mine)
    return pd.DataFrame(out, columns=COLUMNS)


def primaries_table() -> pd.DataFrame:
    """The declared primary tests (:data:`PRIMARIES`) as a table: claim, statistic, pooling, direction,
    margin and unit, the pilot's seeds and per-seed standard deviation, its planning bound and the seeds
    it asks for."""
    return pd.DataFrame([{"claim": p.claim, "statistic": p.statistic + (f", {p.requires}" if p.requires else ""),
                          "pools": p.pools, "direction": p.direction, "margin": p.margin, "unit": p.unit,
                          "pilot_n": p.pilot_n, "pilot_sd": p.pilot_sd, "planning_sd": p.planning_sd(),
                          "seeds_for_80pct_power": p.seeds_needed()} for p in PRIMARIES])
