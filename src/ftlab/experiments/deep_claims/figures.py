"""Figures of the deep-network claims, made from the saved tables: one per claim, plus accuracy and geometry.

Every effect is the paired per-seed difference used by :mod:`.claims` (positive = better than the
reference arm), shown as its mean over seeds with a 95% Student-t interval
(:func:`ftlab.experiments.verdicts.t_interval`); accuracy axes are clipped to [0, 1].
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ftlab.experiments.deep_claims.claims import GEOMETRY_LAYER, paired
from ftlab.experiments.verdicts import t_interval

__all__ = ["FIGURES", "plot_accuracy", "plot_balancedness", "plot_gamma", "plot_geometry", "plot_knob",
           "plot_signature"]

FIGURES = ("fig_claim1_kappa", "fig_claim2_s", "fig_claim3_gamma", "fig_claim4_signature", "fig_claim5_balancedness",
           "fig_accuracy", "fig_geometry")
_COLORS = {"resnet18": "C0", "nf_resnet18": "C3"}
_STYLES = {"init": "-", "post": "--", "ft": "-", "-": "-"}


def _errorbar(ax, x, values_per_x: list, **kw) -> None:
    stats = [t_interval(v) for v in values_per_x]
    m = np.array([s[0] for s in stats])
    lo = np.array([s[1] for s in stats])
    hi = np.array([s[2] for s in stats])
    yerr = np.vstack([np.nan_to_num(m - lo), np.nan_to_num(hi - m)])
    ax.errorbar(x, m, yerr=yerr, marker="o", ms=3, capsize=2, **kw)


def _seed_means(d: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    return d.groupby([*by, "seed"])["diff"].mean().reset_index()


def plot_knob(ft: pd.DataFrame, knob: str, path) -> None:
    """Claims 1-2: paired accuracy change vs the knob value (log axis; 1 = the baseline), one panel per
    task, one line per (architecture, when)."""
    from ftlab.core.plotting import new_figure, save_figure

    d = paired(ft, lambda f: f.knob == "none", ["arch", "seed", "task", "n_ft"])
    sel = d[d.knob == knob]
    if sel.empty:
        return
    tasks = sorted(sel.task.unique())
    fig, axes = new_figure(1, len(tasks), size=(4.2 * len(tasks), 3.4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        t = sel[sel.task == task]
        base_ns = set(t.n_ft)
        for (arch, when), g in t.groupby(["arch", "when"]):
            base = d[(d.knob == "none") & (d.arch == arch) & (d.task == task) & d.n_ft.isin(base_ns)]
            g = pd.concat([g, base.assign(value=1.0)])
            s = _seed_means(g, ["value"])
            xs = sorted(s.value.unique())
            _errorbar(ax, xs, [s[s.value == x]["diff"].to_numpy() for x in xs], color=_COLORS.get(arch),
                      ls=_STYLES.get(when, "-"), label=f"{arch} ({when})")
        ax.axhline(0, color="k", lw=0.6)
        ax.set_xscale("log", base=2)
        ax.set_title(task, fontsize=9)
        ax.set_xlabel(knob)
        ax.set_ylabel("test accuracy - baseline")
        ax.legend(fontsize=7)
    save_figure(fig, path)


def plot_gamma(ft: pd.DataFrame, path, *, gamma_default: float = 1.0) -> None:
    """Claim 3: paired accuracy change vs gamma (log axis), a line per n_FT, a panel per (arch, task)."""
    from ftlab.core.plotting import new_figure, save_figure

    d = paired(ft, lambda f: f.knob == "none", ["arch", "seed", "task", "n_ft"])
    sel = d[d.knob.isin(["gamma", "none"])].copy()
    if (sel.knob == "gamma").sum() == 0:
        return
    sel.loc[sel.knob == "none", "value"] = gamma_default
    archs, tasks = sorted(sel.arch.unique()), sorted(sel.task.unique())
    fig, axes = new_figure(len(archs), len(tasks), size=(4.2 * len(tasks), 3.3 * len(archs)), squeeze=False)
    for i, arch in enumerate(archs):
        for j, task in enumerate(tasks):
            ax = axes[i, j]
            t = sel[(sel.arch == arch) & (sel.task == task)]
            for n, g in t.groupby("n_ft"):
                xs = sorted(g.value.unique())
                _errorbar(ax, xs, [g[g.value == x].groupby("seed")["diff"].mean().to_numpy() for x in xs],
                          label=f"n_FT={n}")
            ax.axhline(0, color="k", lw=0.6)
            ax.set_xscale("log")
            ax.set_title(f"{arch}, {task}", fontsize=9)
            ax.set_xlabel("readout scale gamma")
            ax.set_ylabel(f"accuracy - accuracy(gamma={gamma_default:g})")
            ax.legend(fontsize=7)
    save_figure(fig, path)


def plot_signature(table: pd.DataFrame, path) -> None:
    """Claim 4: the per-seed correlation across arms (mean r and 95% interval from the claims table)."""
    from ftlab.core.plotting import new_figure, save_figure

    t = table[table.claim.astype(str) == "4"]
    if t.empty:
        return
    fig, axes = new_figure(1, 2, size=(10, 3.6), squeeze=False)
    for ax, measure in zip(axes[0], ("PR", "ENSD")):
        s = t[t.knob == f"all arms ({measure})"].reset_index(drop=True)
        labels = [f"{a}\n{k}" for a, k in zip(s.arch, s.task)]
        x = np.arange(len(s))
        yerr = np.vstack([np.nan_to_num(s.effect - s.ci_low), np.nan_to_num(s.ci_high - s.effect)])
        ax.errorbar(x, s.effect, yerr=yerr, fmt="o", capsize=3, color="k")
        ax.axhline(0, color="k", lw=0.6)
        ax.set_xticks(x, labels, fontsize=6)
        ax.set_ylim(-1, 1)
        ax.set_ylabel("correlation r across arms")
        ax.set_title(("accuracy gain vs compression (-change of centred PR)" if measure == "PR" else
                      "accuracy gain vs change of centred ENSD with the PT network") + f", layer '{GEOMETRY_LAYER}'",
                     fontsize=8)
    save_figure(fig, path)


def plot_balancedness(ft: pd.DataFrame, path) -> None:
    """Claim 5: paired accuracy change vs balancedness b (reference b = 0), a line per task kind,
    a panel per when."""
    from ftlab.core.plotting import new_figure, save_figure

    d = paired(ft, lambda f: f.b == 0.0, ["seed", "p", "when"])
    whens = sorted(d.when.unique())
    fig, axes = new_figure(1, len(whens), size=(4.6 * len(whens), 3.5), squeeze=False)
    for ax, when in zip(axes[0], whens):
        t = d[d.when == when]
        for kind, g in t.groupby("kind"):
            s = g.groupby(["b", "seed"])["diff"].mean().reset_index()
            xs = sorted(s.b.unique())
            _errorbar(ax, xs, [s[s.b == x]["diff"].to_numpy() for x in xs], ls="-" if kind == "new" else "--",
                      label=f"{kind} moduli")
        ax.axhline(0, color="k", lw=0.6)
        ax.set_title(f"balancedness set {'at PT initialization' if when == 'init' else 'before fine-tuning'}", fontsize=9)
        ax.set_xlabel("balancedness b")
        ax.set_ylabel("test accuracy - accuracy(b=0)")
        ax.legend(fontsize=7)
    save_figure(fig, path)


def plot_accuracy(ft: pd.DataFrame, path) -> None:
    """Fine-tuned test accuracy vs n_FT per arm (mean over seeds, unpaired 95% interval), a panel per
    (arch, task); axes clipped to [0, 1]."""
    from ftlab.core.plotting import new_figure, save_figure

    archs, tasks = sorted(ft.arch.unique()), sorted(ft.task.unique())
    fig, axes = new_figure(len(archs), len(tasks), size=(4.4 * len(tasks), 3.4 * len(archs)), squeeze=False)
    for i, arch in enumerate(archs):
        for j, task in enumerate(tasks):
            ax = axes[i, j]
            t = ft[(ft.arch == arch) & (ft.task == task)]
            for (knob, when, value), g in t.groupby(["knob", "when", "value"]):
                ns = sorted(g.n_ft.unique())
                base = knob == "none"
                _errorbar(ax, ns, [g[g.n_ft == n].acc.to_numpy() for n in ns], lw=2 if base else 0.8,
                          color="k" if base else None, label="baseline" if base else f"{knob}={value:g} ({when})")
            ax.set_xscale("log")
            ax.set_ylim(0, 1)
            ax.set_title(f"{arch}, {task}", fontsize=9)
            ax.set_xlabel("n_FT")
            ax.set_ylabel("FT test accuracy")
            ax.legend(fontsize=5, ncol=2)
    save_figure(fig, path)


def plot_geometry(ft: pd.DataFrame, path, stages: tuple[str, ...]) -> None:
    """Per stage: centred PR of the fine-tuned representation, its centred ENSD and linear CKA with the
    unintervened pretrained network (mean over seeds and tasks), a line per arm."""
    from ftlab.core.plotting import new_figure, save_figure

    col = f"pr_post_c:{stages[-1]}"
    if col not in ft.columns:
        return
    g = ft[ft[col].notna()]
    if g.empty:
        return
    archs = sorted(g.arch.unique())
    fig, axes = new_figure(len(archs), 3, size=(13, 3.4 * len(archs)), squeeze=False)
    for i, arch in enumerate(archs):
        t = g[g.arch == arch]
        for (knob, when, value), a in t.groupby(["knob", "when", "value"]):
            base = knob == "none"
            for j, key in enumerate(("pr_post_c", "ensd_c", "cka")):
                axes[i, j].plot(list(stages), [a[f"{key}:{s}"].mean() for s in stages], marker="o", ms=3,
                                lw=2 if base else 0.8, color="k" if base else None,
                                label="baseline" if base else f"{knob}={value:g} ({when})")
        titles = ("centred PR after FT", "centred ENSD with the PT network", "linear CKA with the PT network")
        for j, title in enumerate(titles):
            axes[i, j].set_title(f"{arch}: {title} (n_FT={int(t.n_ft.iloc[0])})", fontsize=8)
            axes[i, j].tick_params(axis="x", labelsize=7)
        axes[i, 2].set_ylim(0, 1)
        axes[i, 2].legend(fontsize=5, ncol=2)
    save_figure(fig, path)
