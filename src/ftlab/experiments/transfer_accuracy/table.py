"""Summaries of a benchmark run: the table, the gap closed, the calibration curve, the bar chart.

Input: the tidy rows of :func:`ftlab.experiments.transfer_accuracy.run.run_benchmark` (one row per setting,
task, seed, method, alpha_mode, n_cal). Outputs:

* :func:`summary_table` -- mean and sample standard deviation over seeds, columns
  ``setting, task, method, alpha_mode, accuracy_mean, accuracy_std, seeds`` (the format of
  ``docs/transfer-benchmark.csv``), plus a per-setting ``mean`` task (average over tasks of the
  per-seed values);
* :func:`gap_closed` -- per setting and method, the fraction of the zero-shot -> fine-tuned gap
  closed, ``(acc - zero_shot) / (finetuned - zero_shot)``, from the task-averaged accuracies;
* :func:`calibration_curve` -- BiCo's accuracy against the number of calibration samples;
* :func:`markdown_tables` and :func:`bar_chart` for the report.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["METHOD_ORDER", "summary_table", "gap_closed", "calibration_curve", "markdown_tables", "bar_chart"]

METHOD_ORDER = ("zero_shot", "naive", "identity", "activation_only", "gradient_only", "gradfix", "bico", "finetuned")


def _main_rows(raw: pd.DataFrame) -> pd.DataFrame:
    """Rows at each setting's main calibration size (that of the zero-shot rows)."""
    main = raw[raw["method"] == "zero_shot"].groupby("setting")["n_cal"].first()
    return raw[raw["n_cal"] == raw["setting"].map(main)]


def _order(df: pd.DataFrame) -> pd.DataFrame:
    rank = {m: i for i, m in enumerate(METHOD_ORDER)}
    df = df.assign(_m=df["method"].map(lambda m: rank.get(m, len(rank))), _t=(df["task"] == "mean").astype(int))
    return df.sort_values(["setting", "_t", "task", "alpha_mode", "_m"]).drop(columns=["_m", "_t"]).reset_index(drop=True)


def summary_table(raw: pd.DataFrame) -> pd.DataFrame:
    """Mean +- std over seeds per (setting, task, method, alpha_mode) at the main calibration size."""
    rows = _main_rows(raw)
    avg = (rows.groupby(["setting", "method", "alpha_mode", "seed"], as_index=False)["accuracy"].mean()
           .assign(task="mean"))
    both = pd.concat([rows[["setting", "task", "method", "alpha_mode", "seed", "accuracy"]], avg], ignore_index=True)
    g = both.groupby(["setting", "task", "method", "alpha_mode"])["accuracy"]
    out = pd.DataFrame({"accuracy_mean": g.mean(), "accuracy_std": g.std(ddof=1).fillna(0.0), "seeds": g.count()})
    return _order(out.reset_index())


def gap_closed(table: pd.DataFrame) -> pd.DataFrame:
    """Per setting, method and alpha_mode: task-averaged accuracy and the fraction of the gap closed."""
    mean = table[table["task"] == "mean"]
    out = []
    for (setting, mode), g in mean.groupby(["setting", "alpha_mode"]):
        acc = g.set_index("method")["accuracy_mean"]
        zs, ft = acc.get("zero_shot", np.nan), acc.get("finetuned", np.nan)
        for m, a in acc.items():
            gap = (a - zs) / (ft - zs) if ft - zs > 0 else np.nan
            out.append({"setting": setting, "alpha_mode": mode, "method": m, "accuracy_mean": a,
                        "gain_over_zero_shot": a - zs, "gap_closed": gap})
    return _order(pd.DataFrame(out).assign(task="mean")).drop(columns=["task"])


def calibration_curve(raw: pd.DataFrame) -> pd.DataFrame:
    """BiCo's task-averaged accuracy (mean +- std over seeds) per setting, alpha_mode and n_cal."""
    b = raw[raw["method"] == "bico"]
    settings = b.groupby("setting")["n_cal"].nunique()
    b = b[b["setting"].isin(settings[settings > 1].index)]
    per_seed = b.groupby(["setting", "alpha_mode", "n_cal", "seed"], as_index=False)["accuracy"].mean()
    g = per_seed.groupby(["setting", "alpha_mode", "n_cal"])["accuracy"]
    return pd.DataFrame({"accuracy_mean": g.mean(), "accuracy_std": g.std(ddof=1).fillna(0.0),
                         "seeds": g.count()}).reset_index()


def _pm(m: float, s: float) -> str:
    return f"{100 * m:.1f} ± {100 * s:.1f}"


def markdown_tables(table: pd.DataFrame, gaps: pd.DataFrame, curve: pd.DataFrame) -> str:
    """Markdown: per setting a task x method table (accuracy %, mean ± std), the gap table and the curve."""
    parts = []
    for setting, g in table.groupby("setting", sort=False):
        for mode in ("fixed", "searched"):
            sub = g[g["alpha_mode"] == mode]
            methods = [m for m in METHOD_ORDER if m in set(sub["method"])]
            tasks = [t for t in dict.fromkeys(sub["task"]) if t != "mean"] + ["mean"]
            seeds = int(sub["seeds"].max())
            head = f"**{setting}**, α {'= 1' if mode == 'fixed' else 'searched on validation'} " \
                   f"(accuracy %, mean ± std over {seeds} seeds)\n\n"
            lines = ["| task | " + " | ".join(methods) + " |", "|---" * (len(methods) + 1) + "|"]
            for t in tasks:
                cells = []
                for m in methods:
                    r = sub[(sub["task"] == t) & (sub["method"] == m)]
                    cells.append(_pm(r["accuracy_mean"].iloc[0], r["accuracy_std"].iloc[0]) if len(r) else "–")
                lines.append(f"| {t} | " + " | ".join(cells) + " |")
            parts.append(head + "\n".join(lines))
    lines = ["| setting | α | " + " | ".join(m for m in METHOD_ORDER if m in set(gaps["method"])) + " |"]
    methods = [m for m in METHOD_ORDER if m in set(gaps["method"])]
    lines.append("|---|---" + "|---" * len(methods) + "|")
    for (setting, mode), g in gaps.groupby(["setting", "alpha_mode"], sort=False):
        gg = g.set_index("method")["gap_closed"]
        lines.append(f"| {setting} | {mode} | " + " | ".join(
            f"{100 * gg[m]:.0f}%" if m in gg and np.isfinite(gg[m]) else "–" for m in methods) + " |")
    parts.append("**Fraction of the zero-shot → fine-tuned gap closed** (task-averaged accuracies)\n\n" + "\n".join(lines))
    if len(curve):
        lines = ["| setting | α | " + " | ".join(str(n) for n in sorted(curve["n_cal"].unique())) + " |"]
        ns = sorted(curve["n_cal"].unique())
        lines.append("|---|---" + "|---" * len(ns) + "|")
        for (setting, mode), g in curve.groupby(["setting", "alpha_mode"]):
            gg = g.set_index("n_cal")
            lines.append(f"| {setting} | {mode} | " + " | ".join(
                _pm(gg.loc[n, "accuracy_mean"], gg.loc[n, "accuracy_std"]) if n in gg.index else "–" for n in ns) + " |")
        parts.append("**BiCo accuracy against calibration size** (samples; task-averaged accuracy %)\n\n" + "\n".join(lines))
    return "\n\n".join(parts) + "\n"


def bar_chart(table: pd.DataFrame, path, *, alpha_mode: str = "fixed"):
    """Grouped bars: per setting, the task-averaged accuracy of every method (± std over seeds)."""
    from ftlab.core.plotting import new_figure, save_figure

    mean = table[(table["task"] == "mean") & (table["alpha_mode"] == alpha_mode)]
    settings = list(dict.fromkeys(mean["setting"]))
    methods = [m for m in METHOD_ORDER if m in set(mean["method"])]
    fig, ax = new_figure(1, 1, size=(max(6.0, 1.6 * len(settings) * len(methods) / 4), 3.6))
    width = 0.8 / len(methods)
    for i, m in enumerate(methods):
        vals, errs = [], []
        for s in settings:
            r = mean[(mean["setting"] == s) & (mean["method"] == m)]
            vals.append(100 * r["accuracy_mean"].iloc[0] if len(r) else np.nan)
            errs.append(100 * r["accuracy_std"].iloc[0] if len(r) else 0.0)
        ax.bar(np.arange(len(settings)) + (i - (len(methods) - 1) / 2) * width, vals, width, yerr=errs, label=m, capsize=2)
    ax.set_xticks(np.arange(len(settings)))
    ax.set_xticklabels(settings)
    ax.set_ylabel("test accuracy (%), mean over tasks")
    ax.set_title(f"Task-vector transfer, α {'= 1' if alpha_mode == 'fixed' else 'searched'}")
    ax.legend(fontsize=7, ncol=4, loc="upper left", bbox_to_anchor=(0, -0.12))
    return save_figure(fig, path)
