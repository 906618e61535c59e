"""Summaries of a benchmark run: accuracy tables with intervals, the gap closed, per-layer alignment, figures.

Input: the tidy records of :func:`ftlab.experiments.transfer_accuracy.run.run_benchmark`, or their compact form
(:func:`compact_records`, the format of ``docs/transfer-benchmark-records.csv``): ``record="accuracy"`` rows (one
per setting, task, seed, method, calibration, alpha_mode), ``record="estimate"`` rows (the diagnostic's estimate
read off BiCo's fit) and ``record="layer_bin"`` rows (BiCo's per-layer alignment, summarised per fifth of the
target's depth; the run's own ``record="layer"`` rows are binned on the fly). Outputs:

* :func:`summary_table` -- mean, sample standard deviation and 95% Student-t interval over seeds
  (:func:`ftlab.experiments.verdicts.t_interval`) per (setting, task, method, calibration, alpha_mode), plus a
  per-setting ``mean`` task (the average over tasks of each seed's accuracies);
* :func:`gap_closed` -- per seed, ``(acc - base) / (finetuned - base)`` on task-averaged accuracies (``base``: the
  target's probe or zero-shot accuracy; undefined for a run whose gap is below
  :data:`~ftlab.experiments.transfer_accuracy.claims.MIN_RUN_GAP`), then its mean and interval over seeds;
* :func:`real_pairs_gap` -- the same averaged over the real pairs, seed by seed;
* :func:`layer_table` -- per setting and fifth of the target's depth: median Procrustes similarity of the two bases'
  input activations and output gradients, beside the share of ``||tau_A||^2`` carried there;
* :func:`estimate_cells` / :func:`estimate_ranking` -- the diagnostic's estimate beside the gain BiCo delivered
  per (setting, task, seed), and Spearman's rank correlation over (setting, task) cells;
* :func:`family_figure` -- one figure per family of pairs.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ftlab.experiments.transfer_accuracy.claims import BASELINES, MIN_RUN_GAP
from ftlab.experiments.verdicts import correlation_interval, t_interval

__all__ = ["BASELINES", "METHOD_ORDER", "accuracy_records", "compact_records", "estimate_cells", "estimate_ranking",
           "family_figure", "gap_closed", "layer_table", "per_seed_gaps", "real_pairs_gap", "summary_table"]

METHOD_ORDER = ("probe", "zero_shot", "naive", "naive+repair", "identity", "transfusion", "gradfix", "bico_input_only",
                "bico_output_only", "activation_only", "gradient_only", "bico", "bico_centred", "bico+repair",
                "bico_centred+repair", "recommended/sum", "recommended/split", "recommended/first", "recommended",
                "finetuned")
_KEYS = ["setting", "task", "method", "calibration", "alpha_mode"]
_BINS = 5


def accuracy_records(raw: pd.DataFrame) -> pd.DataFrame:
    """The ``record == "accuracy"`` rows (all rows when there is no ``record`` column)."""
    if "record" not in raw.columns:
        return raw
    return raw[raw["record"] == "accuracy"].dropna(axis=1, how="all")


def _order(df: pd.DataFrame, task_col: bool = True) -> pd.DataFrame:
    rank = {m: i for i, m in enumerate(METHOD_ORDER)}
    df = df.assign(_m=df["method"].map(lambda m: rank.get(m, len(rank))))
    cols = ["setting", "alpha_mode", "calibration", "_m"]
    if task_col:
        df = df.assign(_t=(df["task"] == "mean").astype(int))
        cols = ["setting", "_t", "task", "alpha_mode", "calibration", "_m"]
    return df.sort_values(cols, kind="stable").drop(columns=[c for c in ("_m", "_t") if c in df]).reset_index(drop=True)


def _expand_shared(acc: pd.DataFrame) -> pd.DataFrame:
    """Rows that do not depend on the calibration (baselines, fine-tuned, naive, TransFusion: ``calibration ==
    "-"``) copied into every calibration set of their setting, so each calibration's table is complete."""
    cals = sorted(set(acc["calibration"]) - {"-"}) or ["-"]
    shared = acc[acc["calibration"] == "-"]
    own = acc[acc["calibration"] != "-"]
    parts = [own] + [shared.assign(calibration=c) for c in cals]
    return pd.concat(parts, ignore_index=True)


def summary_table(raw: pd.DataFrame) -> pd.DataFrame:
    """Mean, std and 95% t-interval over seeds; columns ``setting, task, method, calibration, alpha_mode,
    accuracy_mean, accuracy_std, ci_low, ci_high, seeds``."""
    acc = _expand_shared(accuracy_records(raw))
    avg = acc.groupby(["setting", "method", "calibration", "alpha_mode", "seed"], as_index=False)["accuracy"].mean()
    both = pd.concat([acc[[*_KEYS, "seed", "accuracy"]], avg.assign(task="mean")], ignore_index=True)
    out = []
    for key, g in both.groupby(_KEYS, sort=False):
        v = g["accuracy"].to_numpy(dtype=float)
        m, lo, hi = t_interval(v)
        out.append({**dict(zip(_KEYS, key)), "accuracy_mean": m, "accuracy_std": float(np.std(v, ddof=1)) if len(v) > 1
                    else 0.0, "ci_low": lo, "ci_high": hi, "seeds": len(v)})
    return _order(pd.DataFrame(out))


def per_seed_gaps(raw: pd.DataFrame) -> pd.DataFrame:
    """Per (setting, calibration, alpha_mode, method, seed): task-averaged accuracy, the base and fine-tuned
    accuracies and the gap closed ``(acc - base) / (finetuned - base)`` (nan when fine-tuning beats the base by less
    than :data:`~ftlab.experiments.transfer_accuracy.claims.MIN_RUN_GAP`)."""
    acc = _expand_shared(accuracy_records(raw))
    avg = acc.groupby(["setting", "calibration", "alpha_mode", "method", "seed"], as_index=False)["accuracy"].mean()
    rows = []
    for (setting, cal, mode, seed), g in avg.groupby(["setting", "calibration", "alpha_mode", "seed"]):
        a = g.set_index("method")["accuracy"]
        base_name = next((b for b in BASELINES if b in a), None)
        if base_name is None or "finetuned" not in a:
            continue
        base, ft = a[base_name], a["finetuned"]
        for m, v in a.items():
            rows.append({"setting": setting, "calibration": cal, "alpha_mode": mode, "method": m, "seed": seed,
                         "accuracy": v, "base": base, "finetuned": ft,
                         "gap_closed": (v - base) / (ft - base) if ft - base >= MIN_RUN_GAP else math.nan})
    return pd.DataFrame(rows)


def _interval_rows(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    out = []
    for key, g in df.groupby(keys, sort=False):
        m, lo, hi = t_interval(g["gap_closed"].to_numpy(dtype=float))
        out.append({**dict(zip(keys, key if isinstance(key, tuple) else (key,))),
                    "accuracy_mean": float(g["accuracy"].mean()), "gain": float((g["accuracy"] - g["base"]).mean()),
                    "gap_closed": m, "gap_low": lo, "gap_high": hi, "seeds": int(g["gap_closed"].notna().sum())})
    return pd.DataFrame(out)


_GAP_COLUMNS = ["setting", "calibration", "alpha_mode", "method", "accuracy_mean", "gain", "gap_closed", "gap_low",
                "gap_high", "seeds"]


def gap_closed(raw: pd.DataFrame) -> pd.DataFrame:
    """Per setting, calibration, alpha_mode and method: mean task-averaged accuracy, mean gain over the base, and
    the gap closed (mean over seeds of the per-seed gap, with its 95% t-interval)."""
    g = per_seed_gaps(raw)
    if not len(g):
        return pd.DataFrame(columns=_GAP_COLUMNS)
    return _order(_interval_rows(g, ["setting", "calibration", "alpha_mode", "method"]), task_col=False)


def real_pairs_gap(raw: pd.DataFrame, settings) -> pd.DataFrame:
    """The gap closed averaged over ``settings`` (the real pairs) seed by seed, then its mean and interval."""
    g = per_seed_gaps(raw)
    if not len(g):
        return pd.DataFrame(columns=_GAP_COLUMNS)
    g = g[g["setting"].isin(list(settings))]
    if not len(g):
        return pd.DataFrame(columns=_GAP_COLUMNS)
    per = g.groupby(["calibration", "alpha_mode", "method", "seed"], as_index=False)[
        ["gap_closed", "accuracy", "base"]].mean()
    per["setting"] = "real pairs"
    return _order(_interval_rows(per, ["setting", "calibration", "alpha_mode", "method"]), task_col=False)


# ------------------------------------------------------------------------------------ layers, estimates
def _layer_bins(raw: pd.DataFrame) -> pd.DataFrame:
    """``record == "layer_bin"`` rows; computed from ``record == "layer"`` rows when the records are the run's own."""
    if "record" not in raw.columns:
        return pd.DataFrame()
    have = raw[raw["record"] == "layer_bin"]
    if len(have):
        return have.dropna(axis=1, how="all")
    lay = raw[raw["record"] == "layer"].copy()
    if not len(lay):
        return pd.DataFrame()
    n = lay.groupby(["setting", "task", "seed"])["order"].transform("max").clip(lower=1)
    lay["bin"] = np.minimum((lay["order"] / n * _BINS).astype(int), _BINS - 1)
    if "out_similarity" not in lay:
        lay["out_similarity"] = math.nan
    for c in ("in_similarity", "in_cka", "out_cka"):
        if c not in lay:
            lay[c] = math.nan
    out = lay.groupby(["setting", "task", "seed", "calibration", "bin"], as_index=False).agg(
        in_similarity=("in_similarity", "median"), out_similarity=("out_similarity", "median"),
        in_cka=("in_cka", "median"), out_cka=("out_cka", "median"), tau_share=("tau_share", "sum"),
        layers=("point", "nunique"))
    return out.assign(record="layer_bin")


def layer_table(raw: pd.DataFrame) -> pd.DataFrame:
    """Per setting and fifth of the target's depth: medians over tasks and seeds of the per-bin median Procrustes
    similarity of the two bases' input activations and output gradients (and their CKA where the fit recorded
    second moments); the mean share of ``||tau_A||^2`` in the bin; the number of layers."""
    lb = _layer_bins(raw)
    if not len(lb):
        return pd.DataFrame()
    for c in ("in_similarity", "in_cka", "out_cka"):
        if c not in lb:
            lb = lb.assign(**{c: math.nan})
    agg = lb.groupby(["setting", "bin"], sort=False).agg(
        in_similarity=("in_similarity", "median"), out_similarity=("out_similarity", "median"),
        in_cka=("in_cka", "median"), out_cka=("out_cka", "median"), tau_share=("tau_share", "mean"),
        layers=("layers", "max")).reset_index()
    agg["depth"] = agg["bin"].map(lambda b: f"{b / _BINS:.1f}–{(b + 1) / _BINS:.1f}")
    return agg


def estimate_cells(raw: pd.DataFrame, *, calibration: str = "n100", method: str = "bico") -> pd.DataFrame:
    """Per (setting, task, seed): the diagnostic's ``estimate``, BiCo's accuracy at alpha = 1, the target's base and
    fine-tuned accuracy, ``gain`` (BiCo minus base) and ``below`` (BiCo below the base) on the test set, and
    ``val_gain`` / ``below_val`` on the validation set (nan / False where it was not recorded)."""
    if "record" not in raw.columns or not (raw["record"] == "estimate").any():
        return pd.DataFrame()
    est = raw[(raw["record"] == "estimate") & (raw["calibration"] == calibration)]
    if "method" in est.columns:  # the estimate read off this method's own fit (records before it said so: BiCo's)
        est = est[est["method"].fillna("").replace("", "bico") == method]
    est = est.groupby(["setting", "task", "seed"])["estimate"].mean()
    acc = accuracy_records(raw)
    acc = acc[acc["alpha_mode"] == "fixed"]
    a = acc[(acc["method"] == method) & (acc["calibration"] == calibration)].groupby(
        ["setting", "task", "seed"])["accuracy"].mean()
    base = acc[acc["method"].isin(BASELINES)].groupby(["setting", "task", "seed"])["accuracy"].mean()
    ft = acc[acc["method"] == "finetuned"].groupby(["setting", "task", "seed"])["accuracy"].mean()
    cells = pd.concat([est.rename("estimate"), a.rename("accuracy"), base.rename("base"), ft.rename("finetuned")],
                      axis=1).dropna().reset_index()
    cells["gain"] = cells["accuracy"] - cells["base"]
    cells["below"] = cells["gain"] < 0
    if "val_accuracy" in acc.columns:
        va = acc[(acc["method"] == method) & (acc["calibration"] == calibration)].groupby(
            ["setting", "task", "seed"])["val_accuracy"].mean()
        vb = acc[acc["method"].isin(BASELINES)].groupby(["setting", "task", "seed"])["val_accuracy"].mean()
        vg = (va - vb).rename("val_gain")
        cells = cells.merge(vg.reset_index(), on=["setting", "task", "seed"], how="left")
    else:
        cells["val_gain"] = math.nan
    cells["below_val"] = cells["val_gain"] < 0
    return cells


def estimate_ranking(raw: pd.DataFrame, *, calibration: str = "n100", method: str = "bico") -> dict:
    """Spearman correlation between the diagnostic's estimate and the gain BiCo delivered at alpha = 1 over
    (setting, task) cells (seed-averaged), with Fisher's z interval; ``{}`` when the run holds no estimates."""
    from scipy.stats import spearmanr

    cells = estimate_cells(raw, calibration=calibration, method=method)
    if not len(cells):
        return {}
    both = cells.groupby(["setting", "task"])[["estimate", "gain"]].mean()
    if len(both) < 3 or np.ptp(both["estimate"]) == 0 or np.ptp(both["gain"]) == 0:
        return {"n": len(both)}
    rho = float(spearmanr(both["estimate"], both["gain"]).statistic)
    p, lo, hi = correlation_interval(rho, len(both))
    return {"rho": rho, "low": lo, "high": hi, "p": p, "n": len(both), "cells": both.reset_index()}


def compact_records(raw: pd.DataFrame) -> pd.DataFrame:
    """The records a recorded run keeps under docs/: accuracy and estimate rows with the columns the summaries read,
    and the per-layer rows binned into fifths of the target's depth (``record="layer_bin"``)."""
    acc = accuracy_records(raw).reindex(columns=["setting", "task", "seed", "method", "calibration", "alpha_mode",
                                                 "alpha", "accuracy", "val_accuracy"]).assign(record="accuracy")
    parts = [acc]
    if "record" in raw.columns and (raw["record"] == "estimate").any():
        est = raw[raw["record"] == "estimate"].reindex(columns=["setting", "task", "seed", "method", "calibration",
                                                               "estimate"])
        parts.append(est.assign(record="estimate"))
    if "record" in raw.columns and (raw["record"] == "mechanism").any():
        mech = raw[raw["record"] == "mechanism"].reindex(columns=["setting", "task", "seed", "method", "head_drift",
                                                                 "top_share", "never_predicted"])
        parts.append(mech.assign(record="mechanism"))
    lb = _layer_bins(raw)
    if len(lb):
        parts.append(lb.reindex(columns=["setting", "task", "seed", "calibration", "bin", "in_similarity",
                                         "out_similarity", "in_cka", "out_cka", "tau_share", "layers"])
                     .assign(record="layer_bin"))
    out = pd.concat(parts, ignore_index=True)
    cols = ["record", "setting", "task", "seed", "method", "calibration", "alpha_mode", "alpha", "accuracy",
            "val_accuracy", "estimate", "bin", "in_similarity", "out_similarity", "in_cka", "out_cka", "tau_share",
            "layers", "head_drift", "top_share", "never_predicted"]
    return out.reindex(columns=cols)


# ------------------------------------------------------------------------------------------ figure
_STYLE: dict[str, dict] = {"fixed": {"marker": "o"}, "searched": {"marker": "s", "mfc": "white"}}


#: The transfers a figure shows (the others are in the tables): the paper's method and baselines, centred BiCo, BiCo
#: with ftlab's repair and copy rule, and the recommended transfer.
FIGURE_METHODS = ("naive", "transfusion", "bico_input_only", "bico_output_only", "activation_only", "bico",
                  "bico_centred", "bico+repair", "recommended")


def _method_points(table: pd.DataFrame, setting: str) -> list[tuple[str, dict]]:
    """``[(label, {alpha_mode: (mean, low, high)})]`` for every method of :data:`FIGURE_METHODS` x calibration of one
    setting (task mean)."""
    t = table[(table["setting"] == setting) & (table["task"] == "mean")]
    out = []
    for m in FIGURE_METHODS:
        sub = t[t["method"] == m]
        for cal in sorted(set(sub["calibration"]), key=lambda c: (c != "n100", c)):
            if m in ("naive", "transfusion") and cal != sorted(set(sub["calibration"]))[-1]:
                continue  # calibration-free: shown once
            r = sub[sub["calibration"] == cal].set_index("alpha_mode")
            label = m if m in ("naive", "transfusion") else f"{m} ({cal})"
            out.append((label, {mode: (r.loc[mode, "accuracy_mean"], r.loc[mode, "ci_low"], r.loc[mode, "ci_high"])
                                for mode in ("fixed", "searched") if mode in r.index}))
    return out


def family_figure(table: pd.DataFrame, settings, path, *, title: str):
    """One figure for a family of pairs: per setting a panel with the target's own accuracy and its direct
    fine-tuning as bands (mean and 95% interval over seeds) and every method at alpha = 1 (filled) and with alpha
    searched on validation (open), mean with its 95% t-interval; accuracies averaged over the tasks (%)."""
    from ftlab.core.plotting import new_figure, save_figure

    settings = [s for s in settings if s in set(table["setting"])]
    if not settings:
        raise ValueError(f"no setting of {title!r} in the table")
    fig, axes = new_figure(1, len(settings), size=(3.6 * len(settings) + 0.6, 4.6), squeeze=False)
    for ax, s in zip(axes[0], settings):
        t = table[(table["setting"] == s) & (table["task"] == "mean") & (table["alpha_mode"] == "fixed")]
        for m, color in (("base", "0.45"), ("finetuned", "tab:green")):
            r = t[t["method"].isin(BASELINES)] if m == "base" else t[t["method"] == m]
            if not len(r):
                continue
            mean, lo, hi = (100 * float(r[c].iloc[0]) for c in ("accuracy_mean", "ci_low", "ci_high"))
            label = ("target's own accuracy (probe / zero-shot)" if m == "base" else "direct fine-tuning")
            ax.axhline(mean, color=color, lw=1.2, label=label)
            if np.isfinite(lo):
                ax.axhspan(lo, hi, color=color, alpha=0.18, lw=0)
        pts = _method_points(table, s)
        for i, (_label, modes) in enumerate(pts):
            for j, mode in enumerate(("fixed", "searched")):
                if mode not in modes:
                    continue
                mean, lo, hi = (100 * v for v in modes[mode])
                err = [[mean - lo], [hi - mean]] if np.isfinite(lo) else None
                ax.errorbar(i + (j - 0.5) * 0.3, mean, yerr=err, color=f"C{i}", capsize=2, ms=5, lw=1,
                            ls="none", **_STYLE[mode])
        ax.set_xticks(range(len(pts)))
        ax.set_xticklabels([p[0] for p in pts], rotation=60, ha="right", fontsize=7)
        ax.set_xlim(-0.7, len(pts) - 0.3)
        ax.set_title(s, fontsize=9)
        ax.tick_params(axis="y", labelsize=7)
    axes[0][0].set_ylabel("test accuracy (%), mean over seeds with 95% interval", fontsize=8)
    from matplotlib.lines import Line2D

    handles, labels = axes[0][0].get_legend_handles_labels()
    handles += [Line2D([], [], color="k", marker="o", ls="none"), Line2D([], [], color="k", marker="s", mfc="white",
                                                                          ls="none")]
    labels += ["α = 1", "α searched on validation"]
    axes[0][-1].legend(handles, labels, loc="best", fontsize=6, framealpha=0.85)
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)


# ------------------------------------------------------------------------------------ alpha, mechanism
def alpha_landing(raw: pd.DataFrame, *, top: float | None = None) -> pd.DataFrame:
    """Where the alpha searched on validation landed: per setting and method (first calibration), the cells, the
    median alpha, and the share of cells at each end of the grid (0: the target left as it is; ``top``: the grid's
    largest alpha, default the largest alpha recorded)."""
    acc = accuracy_records(raw)
    s = acc[(acc["alpha_mode"] == "searched") & acc["alpha"].notna() & (acc["calibration"] != "k5")]
    if not len(s):
        return pd.DataFrame(columns=["setting", "method", "cells", "median_alpha", "at_zero", "at_top", "top"])
    top = float(s["alpha"].max()) if top is None else float(top)
    out = s.groupby(["setting", "method"], sort=False).agg(
        cells=("alpha", "size"), median_alpha=("alpha", "median"), at_zero=("alpha", lambda a: float((a == 0).mean())),
        at_top=("alpha", lambda a: float((a == top).mean()))).reset_index()
    return _by_method(out.assign(top=top))


def mechanism_table(raw: pd.DataFrame) -> pd.DataFrame:
    """Per setting and method (``record="mechanism"``, alpha = 1): mean over tasks and seeds of the channel-mean drift
    at the target's last norm layer with running statistics (base B's channel standard deviations, before any repair),
    of the largest share of test images predicted as one class, and of the number of classes never predicted."""
    if "record" not in raw.columns or not (raw["record"] == "mechanism").any():
        return pd.DataFrame(columns=["setting", "method", "head_drift", "top_share", "never_predicted", "seeds"])
    m = raw[raw["record"] == "mechanism"].copy()
    for c in ("head_drift", "top_share", "never_predicted"):
        m[c] = pd.to_numeric(m[c], errors="coerce")
    out = m.groupby(["setting", "method"], sort=False).agg(
        head_drift=("head_drift", "mean"), top_share=("top_share", "mean"),
        never_predicted=("never_predicted", "mean"), seeds=("seed", "nunique")).reset_index()
    return _by_method(out)


def _by_method(df: pd.DataFrame) -> pd.DataFrame:
    """Rows in the order settings first appear, methods in :data:`METHOD_ORDER` within a setting."""
    rank = {m: i for i, m in enumerate(METHOD_ORDER)}
    first = {s: i for i, s in enumerate(dict.fromkeys(df["setting"]))}
    key = df.assign(_s=df["setting"].map(first), _m=df["method"].map(lambda m: rank.get(m, len(rank))))
    return key.sort_values(["_s", "_m"], kind="stable").drop(columns=["_s", "_m"]).reset_index(drop=True)
