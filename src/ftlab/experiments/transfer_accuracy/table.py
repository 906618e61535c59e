"""Summaries of a benchmark run: accuracy tables with intervals, the gap closed, per-layer alignment, figures.

Input: the tidy records of :func:`ftlab.experiments.transfer_accuracy.run.run_benchmark`: ``record="accuracy"``
rows (one per setting, task, seed, method, calibration, alpha_mode), ``record="layer"`` rows (BiCo's fit per
target capture point) and ``record="estimate"`` rows (the diagnostic's estimate). Outputs:

* :func:`summary_table` -- mean, sample standard deviation and 95% Student-t interval over seeds
  (:func:`ftlab.experiments.verdicts.t_interval`) per (setting, task, method, calibration, alpha_mode), plus a
  per-setting ``mean`` task (the average over tasks of each seed's accuracies); the format of
  ``docs/transfer-benchmark.csv``;
* :func:`gap_closed` -- per seed, ``(acc - base) / (finetuned - base)`` on task-averaged accuracies (``base``: the
  target's probe or zero-shot accuracy), then its mean and interval over seeds;
* :func:`real_pairs_gap` -- the same averaged over the real pairs (per seed), the issue's headline number;
* :func:`layer_table` -- per setting and relative-depth fifth of the target: median CKA of the two bases'
  input activations and output gradients, beside the share of ``||tau_A||^2`` carried there;
* :func:`estimate_ranking` -- Spearman's rank correlation between the diagnostic's estimate and the gap
  actually closed, over (setting, task) cells, with a Fisher-z interval;
* :func:`markdown_tables`, :func:`bar_chart`, :func:`dose_response_chart`.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ftlab.experiments.verdicts import correlation_interval, t_interval

__all__ = ["BASELINES", "METHOD_ORDER", "accuracy_records", "bar_chart", "dose_response_chart", "estimate_ranking",
           "gap_closed", "layer_table", "markdown_tables", "per_seed_gaps", "real_pairs_gap", "summary_table"]

METHOD_ORDER = ("probe", "zero_shot", "naive", "identity", "bico_input_only", "bico_output_only", "activation_only",
                "gradient_only", "gradfix", "bico", "finetuned")
#: The target base's own accuracy: a linear probe (real pairs) or the pretrained head (the ViT family).
BASELINES = ("probe", "zero_shot")
_KEYS = ["setting", "task", "method", "calibration", "alpha_mode"]


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
    """Rows that do not depend on the calibration (baselines, fine-tuned, naive: ``calibration == "-"``) copied
    into every calibration set of their setting, so each calibration's table is complete."""
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
    accuracies and the gap closed ``(acc - base) / (finetuned - base)`` (nan when fine-tuning does not beat the base)."""
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
                         "gap_closed": (v - base) / (ft - base) if ft > base else math.nan})
    return pd.DataFrame(rows)


def _interval_rows(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    out = []
    for key, g in df.groupby(keys, sort=False):
        m, lo, hi = t_interval(g["gap_closed"].to_numpy(dtype=float))
        out.append({**dict(zip(keys, key if isinstance(key, tuple) else (key,))),
                    "accuracy_mean": float(g["accuracy"].mean()), "gain": float((g["accuracy"] - g["base"]).mean()),
                    "gap_closed": m, "gap_low": lo, "gap_high": hi, "seeds": int(g["gap_closed"].notna().sum())})
    return pd.DataFrame(out)


def gap_closed(raw: pd.DataFrame) -> pd.DataFrame:
    """Per setting, calibration, alpha_mode and method: mean task-averaged accuracy, mean gain over the base, and
    the gap closed (mean over seeds of the per-seed gap, with its 95% t-interval)."""
    g = per_seed_gaps(raw)
    if not len(g):
        return pd.DataFrame(columns=["setting", "calibration", "alpha_mode", "method", "accuracy_mean", "gain",
                                     "gap_closed", "gap_low", "gap_high", "seeds"])
    return _order(_interval_rows(g, ["setting", "calibration", "alpha_mode", "method"]), task_col=False)


def real_pairs_gap(raw: pd.DataFrame, settings) -> pd.DataFrame:
    """The gap closed averaged over ``settings`` (the real pairs) seed by seed, then its mean and interval."""
    g = per_seed_gaps(raw)
    g = g[g["setting"].isin(list(settings))]
    if not len(g):
        return pd.DataFrame()
    per = g.groupby(["calibration", "alpha_mode", "method", "seed"], as_index=False)[
        ["gap_closed", "accuracy", "base"]].mean()
    per["setting"] = "real pairs"
    return _order(_interval_rows(per, ["setting", "calibration", "alpha_mode", "method"]), task_col=False)


def layer_table(raw: pd.DataFrame, *, bins: int = 5) -> pd.DataFrame:
    """Per setting and relative-depth bin of the target's capture points: median CKA of the inputs and of the
    output gradients, median output-gradient Procrustes similarity, and the mean share of ``||tau_A||^2``."""
    if "record" not in raw.columns:
        return pd.DataFrame()
    lay = raw[raw["record"] == "layer"].copy()
    if not len(lay):
        return pd.DataFrame()
    n = lay.groupby(["setting", "task", "seed"])["order"].transform("max").clip(lower=1)
    lay["bin"] = np.minimum((lay["order"] / n * bins).astype(int), bins - 1)
    share = lay.groupby(["setting", "task", "seed", "bin"])["tau_share"].sum().groupby(["setting", "bin"]).mean()
    agg = lay.groupby(["setting", "bin"]).agg(in_cka=("in_cka", "median"), out_cka=("out_cka", "median"),
                                              out_similarity=("out_similarity", "median")
                                              if "out_similarity" in lay else ("out_cka", "median"),
                                              layers=("point", "nunique"))
    agg["tau_share"] = share
    agg = agg.reset_index()
    agg["depth"] = agg["bin"].map(lambda b: f"{b / bins:.1f}–{(b + 1) / bins:.1f}")
    return agg


def estimate_ranking(raw: pd.DataFrame, *, calibration: str = "n100", alpha_mode: str = "fixed",
                     method: str = "bico") -> dict:
    """Spearman correlation between the diagnostic's estimate and BiCo's gap closed over (setting, task) cells
    (seed-averaged), with Fisher's z interval; ``{}`` when the run holds no estimates."""
    from scipy.stats import spearmanr

    if "record" not in raw.columns or not (raw["record"] == "estimate").any():
        return {}
    est = raw[(raw["record"] == "estimate") & (raw["calibration"] == calibration)]
    est = est.groupby(["setting", "task"])["estimate"].mean()
    acc = _expand_shared(accuracy_records(raw))
    acc = acc[(acc["calibration"] == calibration) & (acc["alpha_mode"] == alpha_mode)]
    cell = acc.groupby(["setting", "task", "method"])["accuracy"].mean().unstack("method")
    base = cell[[b for b in BASELINES if b in cell.columns]].bfill(axis=1).iloc[:, 0]
    gap = (cell[method] - base) / (cell["finetuned"] - base)
    both = pd.concat([est.rename("estimate"), gap.rename("gap")], axis=1).dropna()
    if len(both) < 3:
        return {"n": len(both)}
    rho = float(spearmanr(both["estimate"], both["gap"]).statistic)
    p, lo, hi = correlation_interval(rho, len(both))
    return {"rho": rho, "low": lo, "high": hi, "p": p, "n": len(both), "cells": both.reset_index()}


def _pm(m: float, lo: float, hi: float) -> str:
    if not np.isfinite(lo):
        return f"{100 * m:.1f}"
    return f"{100 * m:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"


def markdown_tables(table: pd.DataFrame, gaps: pd.DataFrame, *, settings=None, calibrations=None,
                    modes=("fixed", "searched")) -> str:
    """Per setting, calibration and alpha mode a task x method table (accuracy %, mean [95% interval]); then
    the gap-closed table."""
    parts = []
    settings = list(dict.fromkeys(table["setting"])) if settings is None else list(settings)
    for setting in settings:
        g = table[table["setting"] == setting]
        cals = [c for c in dict.fromkeys(g["calibration"]) if calibrations is None or c in calibrations]
        for cal in cals:
            for mode in modes:
                sub = g[(g["alpha_mode"] == mode) & (g["calibration"] == cal)]
                if not len(sub):
                    continue
                methods = [m for m in METHOD_ORDER if m in set(sub["method"])]
                tasks = [t for t in dict.fromkeys(sub["task"]) if t != "mean"] + ["mean"]
                seeds = int(sub["seeds"].max())
                head = (f"**{setting}**, calibration {cal}, α {'= 1' if mode == 'fixed' else 'searched on validation'} "
                        f"(accuracy %, mean [95% t-interval] over {seeds} seeds)\n\n")
                lines = ["| task | " + " | ".join(methods) + " |", "|---" * (len(methods) + 1) + "|"]
                for t in tasks:
                    cells = []
                    for m in methods:
                        r = sub[(sub["task"] == t) & (sub["method"] == m)]
                        cells.append(_pm(r["accuracy_mean"].iloc[0], r["ci_low"].iloc[0], r["ci_high"].iloc[0])
                                     if len(r) else "–")
                    lines.append(f"| {t} | " + " | ".join(cells) + " |")
                parts.append(head + "\n".join(lines))
    if len(gaps):
        parts.append(gap_markdown(gaps))
    return "\n\n".join(parts) + "\n"


def gap_markdown(gaps: pd.DataFrame) -> str:
    """The gap-closed table: one row per (setting, calibration, alpha), one column per method (mean [interval])."""
    methods = [m for m in METHOD_ORDER if m in set(gaps["method"]) and m not in (*BASELINES, "finetuned")]
    lines = ["| setting | calibration | α | " + " | ".join(methods) + " |", "|---|---|---" + "|---" * len(methods) + "|"]
    for (setting, cal, mode), g in gaps.groupby(["setting", "calibration", "alpha_mode"], sort=False):
        gg = g.set_index("method")
        cells = []
        for m in methods:
            if m not in gg.index or not np.isfinite(gg.loc[m, "gap_closed"]):
                cells.append("–")
                continue
            r = gg.loc[m]
            iv = f" [{100 * r.gap_low:.0f}, {100 * r.gap_high:.0f}]" if np.isfinite(r.gap_low) else ""
            cells.append(f"{100 * r.gap_closed:.0f}%{iv}")
        lines.append(f"| {setting} | {cal} | {'= 1' if mode == 'fixed' else 'searched'} | " + " | ".join(cells) + " |")
    return ("**Share of the gap closed**, `(acc − base) / (fine-tuned − base)` on task-averaged accuracies, per seed; "
            "mean [95% t-interval] over seeds (base: the target's linear probe, or zero-shot head for the ViT family)"
            "\n\n" + "\n".join(lines))


def bar_chart(gaps: pd.DataFrame, path, *, calibration: str = "n100", alpha_mode: str = "fixed", settings=None,
              title: str = "Share of the probe → fine-tuned gap closed"):
    """Grouped bars: per setting, the gap closed by every method (mean with its 95% interval)."""
    from ftlab.core.plotting import new_figure, save_figure

    g = gaps[(gaps["calibration"] == calibration) & (gaps["alpha_mode"] == alpha_mode)]
    settings = list(dict.fromkeys(g["setting"])) if settings is None else [s for s in settings if s in set(g["setting"])]
    methods = [m for m in METHOD_ORDER if m in set(g["method"]) and m not in (*BASELINES, "finetuned")]
    fig, ax = new_figure(1, 1, size=(max(6.0, 1.3 * len(settings) * max(1, len(methods)) / 3), 3.6))
    width = 0.8 / max(1, len(methods))
    for i, m in enumerate(methods):
        vals, lo, hi = [], [], []
        for s in settings:
            r = g[(g["setting"] == s) & (g["method"] == m)]
            v = float(r["gap_closed"].iloc[0]) if len(r) else np.nan
            vals.append(v)
            lo.append(v - float(r["gap_low"].iloc[0]) if len(r) and np.isfinite(r["gap_low"].iloc[0]) else 0.0)
            hi.append(float(r["gap_high"].iloc[0]) - v if len(r) and np.isfinite(r["gap_high"].iloc[0]) else 0.0)
        ax.bar(np.arange(len(settings)) + (i - (len(methods) - 1) / 2) * width, vals, width, yerr=[lo, hi], label=m,
               capsize=2)
    ax.axhline(0, color="k", lw=0.6)
    ax.axhline(1, color="k", lw=0.6, ls=":")
    ax.axhline(0.5, color="0.5", lw=0.6, ls="--")
    ax.set_xticks(np.arange(len(settings)))
    ax.set_xticklabels(settings, fontsize=7)
    ax.set_ylabel("share of the gap closed (0 = base, 1 = fine-tuned)")
    ax.set_title(f"{title}, α {'= 1' if alpha_mode == 'fixed' else 'searched'}, calibration {calibration}", fontsize=9)
    ax.legend(fontsize=7, ncol=4, loc="upper left", bbox_to_anchor=(0, -0.14))
    return save_figure(fig, path)


def dose_response_chart(gaps: pd.DataFrame, path, order, *, calibration: str = "n100", alpha_mode: str = "fixed"):
    """The ViT family's relatedness axis: gap closed per method against how related the target is."""
    from ftlab.core.plotting import new_figure, save_figure

    g = gaps[(gaps["calibration"] == calibration) & (gaps["alpha_mode"] == alpha_mode)]
    settings = [s for s in order if s in set(g["setting"])]
    methods = [m for m in METHOD_ORDER if m in set(g["method"]) and m not in (*BASELINES, "finetuned")]
    fig, ax = new_figure(1, 1, size=(6.0, 3.4))
    x = np.arange(len(settings))
    for m in methods:
        r = g[g["method"] == m].set_index("setting").reindex(settings)
        ax.errorbar(x, r["gap_closed"], yerr=[r["gap_closed"] - r["gap_low"], r["gap_high"] - r["gap_closed"]],
                    marker="o", ms=3, lw=1, capsize=2, label=m)
    ax.axhline(0, color="k", lw=0.6)
    ax.axhline(1, color="k", lw=0.6, ls=":")
    ax.set_xticks(x)
    ax.set_xticklabels(settings, fontsize=7)
    ax.set_xlabel("target: most related → least related to the source")
    ax.set_ylabel("share of the gap closed")
    ax.set_title(f"Controlled ViTs, α {'= 1' if alpha_mode == 'fixed' else 'searched'}", fontsize=9)
    ax.legend(fontsize=7)
    return save_figure(fig, path)
