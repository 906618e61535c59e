"""Figures of the deep-network claims, made from the saved tables: the five primaries, one per claim, plus
accuracy and geometry.

The primaries' figure shows each primary's pooled effect with the intervals it was judged by (95% and
family level, exact sign-flip) beside its strata. The other figures show the paired per-seed
differences used by :mod:`.claims` (positive = better than the reference arm) as their mean over seeds
with a descriptive 95% Student-t interval (:func:`ftlab.experiments.verdicts.t_interval`); accuracy
axes are clipped to [0, 1].
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ftlab.experiments.deep_claims.claims import ALIGN_BOUND, GEOMETRY_LAYER, Row, paired
from ftlab.experiments.verdicts import t_interval

__all__ = ["FIGURES", "plot_accuracy", "plot_all", "plot_balancedness", "plot_gamma", "plot_geometry", "plot_knob",
           "plot_primaries", "plot_signature"]

FIGURES = ("fig_primaries", "fig_claim1_kappa", "fig_claim2_s", "fig_claim3_gamma", "fig_claim4_signature",
           "fig_claim5_balancedness", "fig_accuracy", "fig_geometry")
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


def plot_signature(ft: pd.DataFrame, path, *, geometry_at: int | None = None) -> None:
    """Claim 4: per intervention (architecture, task, arm; n_FT = ``geometry_at``), its mean compression
    -(log PR - log PR of the baseline) against its mean alignment (CKA with the unintervened PT network
    minus the baseline's), filled when it improved accuracy on average; a panel per architecture."""
    from ftlab.core.plotting import new_figure, save_figure
    from ftlab.experiments.deep_claims.claims import _signature_cells

    cells = _signature_cells(ft, geometry_at)
    if cells.empty:
        return
    arm = ["arch", "task", "knob", "when", "value"]
    m = cells.groupby(arm)[["diff", "comp", "align"]].mean().reset_index()
    archs = sorted(m.arch.unique())
    fig, axes = new_figure(1, len(archs), size=(5.2 * len(archs), 4.0), squeeze=False)
    markers = {t: mk for t, mk in zip(sorted(m.task.unique()), "osD^v")}
    for ax, arch in zip(axes[0], archs):
        for r in m[m.arch == arch].itertuples():
            ok = r.diff > 0
            ax.scatter(r.align, r.comp, marker=markers[r.task], s=36, edgecolor="k",
                       facecolor="C2" if ok else "none", label=f"{r.task}, {'gain' if ok else 'no gain'}")
        ax.axhline(0, color="k", lw=0.6)
        ax.axvline(ALIGN_BOUND, color="C3", lw=0.8, ls=":")
        handles, labels = ax.get_legend_handles_labels()
        uniq = dict(zip(labels, handles))
        ax.legend(uniq.values(), uniq.keys(), fontsize=6)
        ax.set_xlabel("alignment: CKA with the PT network - baseline's")
        ax.set_ylabel("compression: -(log PR - baseline's)")
        ax.set_title(f"{arch}, layer '{GEOMETRY_LAYER}' (filled: mean accuracy gain > 0)", fontsize=8)
    save_figure(fig, path)


def plot_primaries(rows: list[Row], table: pd.DataFrame, path) -> None:
    """The five primaries: per primary, each stratum's mean effect (descriptive 95% t interval) and the
    pooled effect with its judged 95% interval (thick) and family-level interval (thin), verdict in the
    label; accuracy primaries in points, claim 4 in log PR."""
    from ftlab.core.plotting import new_figure, save_figure

    prim = [r for r in rows if r.level == "primary"]
    t = table[table.level == "primary"].reset_index(drop=True)
    if not prim:
        return
    fig, axes = new_figure(1, len(prim), size=(3.3 * len(prim), 4.2), squeeze=False)
    for ax, r, j in zip(axes[0], prim, t.itertuples()):
        scale = 100.0 if r.unit == "accuracy" else 1.0
        names = list(r.evidence.strata_names)
        mat = np.asarray(r.evidence.strata, dtype=float) if r.evidence.strata is not None else np.empty((0, 0))
        for i in range(len(names)):
            _errorbar(ax, [i], [scale * mat[:, i]], color="0.5")
        y = len(names) + 0.5
        for lo, hi, kw in ((j.fam_low, j.fam_high, dict(fmt="none", lw=0.8, capsize=3)),
                           (j.ci_low, j.ci_high, dict(fmt="s", lw=2.5, ms=6))):
            err = np.nan_to_num(scale * np.array([[j.effect - lo], [hi - j.effect]]), nan=0.0, posinf=0.0)
            ax.errorbar([y], [scale * j.effect], yerr=err, color="k", **kw)  # unbounded intervals are not drawn
        ax.axhline(0, color="k", lw=0.6)
        ax.set_xticks([*range(len(names)), y], [*names, "pooled"], rotation=60, fontsize=6)
        ax.set_ylabel("effect (accuracy points)" if r.unit == "accuracy" else "effect (log PR)")
        ax.set_title(f"claim {r.claim}: {j.verdict}\np(Holm)={j.p_holm:.2g}, n={j.seeds}", fontsize=8)
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


def plot_all(out: Path, claims: pd.DataFrame, rows: list[Row], vision: dict | None, modular: dict | None, *,
             gamma_default: float = 1.0, geometry_at: int | None = None, stages: tuple[str, ...] = (),
             figures: tuple[str, ...] | None = None) -> None:
    """Every figure of :data:`FIGURES` the tables allow (``figures``: a subset, ``None`` = all), as
    ``out/<name>.png``."""
    def want(name: str) -> bool:
        return figures is None or name in figures

    if want("fig_primaries"):
        plot_primaries(rows, claims, out / "fig_primaries.png")
    if vision is not None:
        ft = vision["ft"]
        jobs = {"fig_claim1_kappa": lambda p: plot_knob(ft, "kappa", p), "fig_claim2_s": lambda p: plot_knob(ft, "s", p),
                "fig_claim3_gamma": lambda p: plot_gamma(ft, p, gamma_default=gamma_default),
                "fig_claim4_signature": lambda p: plot_signature(ft, p, geometry_at=geometry_at),
                "fig_accuracy": lambda p: plot_accuracy(ft, p)}
        if stages:
            jobs["fig_geometry"] = lambda p: plot_geometry(ft, p, stages)
        for name, job in jobs.items():
            if want(name):
                job(out / f"{name}.png")
    if modular is not None and want("fig_claim5_balancedness"):
        plot_balancedness(modular["ft"], out / "fig_claim5_balancedness.png")
