"""Tables of the LoRA-transfer study from its store (:func:`~ftlab.experiments.lora_transfer.study.load_store`).

Every mean over seeds comes with a 95% Student-t interval (:func:`ftlab.experiments.verdicts.t_interval`),
every comparison is a paired difference by seed with its interval; with 3-4 seeds these are the Student-t
settings of :mod:`ftlab.experiments.verdicts` (the exact sign-flip test needs 6 seeds to decide anything).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ftlab.experiments.verdicts import t_interval

__all__ = ["by_seed", "gap_closed", "heal_table", "markdown", "summary_table"]


def by_seed(records: Sequence[dict], arm: str, k: int | None = None) -> dict[int, float]:
    """``{seed: accuracy}`` of one arm (and heal step ``k``)."""
    return {int(r["seed"]): float(r["acc"]) for r in records if r["arm"] == arm and r.get("k") == k}


def _cell(values: Sequence[float]) -> str:
    m, lo, hi = t_interval(list(values))
    if not values:
        return "--"
    if math.isnan(lo):
        return f"{100 * m:.1f}"
    return f"{100 * m:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"


def _paired(a: dict[int, float], b: dict[int, float]) -> list[float]:
    return [a[s] - b[s] for s in sorted(set(a) & set(b))]


def gap_closed(records: Sequence[dict], arm: str = "ftlab") -> float:
    """``(arm - probe) / (direct - probe)`` on the seed means (nan when a part is missing or the gap is 0)."""
    means = {a: np.mean(list(by_seed(records, a).values())) if by_seed(records, a) else math.nan
             for a in (arm, "probe", "direct")}
    gap = means["direct"] - means["probe"]
    return float((means[arm] - means["probe"]) / gap) if gap and math.isfinite(gap) else math.nan


def summary_table(records: Sequence[dict], arms: Sequence[str]) -> list[dict]:
    """One row per arm: seeds, accuracy mean [95% interval], per-seed values, and the paired differences to B's
    linear probe and to the LoRA trained on B (percentage points)."""
    probe, direct = by_seed(records, "probe"), by_seed(records, "direct")
    rows = []
    for arm in arms:
        acc = by_seed(records, arm)
        if not acc:
            continue
        rows.append({"arm": arm, "seeds": len(acc), "accuracy": _cell(list(acc.values())),
                     "per seed": ", ".join(f"{100 * acc[s]:.1f}" for s in sorted(acc)),
                     "minus probe": _cell(_paired(acc, probe)) if arm != "probe" else "",
                     "minus direct LoRA": _cell(_paired(acc, direct)) if arm != "direct" else ""})
    return rows


def heal_table(records: Sequence[dict], steps: Sequence[int]) -> list[dict]:
    """One row per heal step ``k``: from ftlab's adapter, from a fresh LoRA, their paired difference, and the
    healed adapter minus the LoRA trained on B (all with intervals)."""
    direct = by_seed(records, "direct")
    rows = []
    for k in steps:
        heal, fresh = by_seed(records, "heal", k), by_seed(records, "fresh", k)
        if not heal and not fresh:
            continue
        rows.append({"k": k, "from ftlab's adapter": _cell(list(heal.values())),
                     "from a fresh LoRA": _cell(list(fresh.values())), "difference": _cell(_paired(heal, fresh)),
                     "ftlab + heal minus direct LoRA": _cell(_paired(heal, direct))})
    return rows


def markdown(rows: Sequence[dict]) -> str:
    """A Markdown table of dict rows (the first row's keys are the columns)."""
    if not rows:
        return "(no records)\n"
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"
