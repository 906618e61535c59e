"""The benchmark's pilot: does direct fine-tuning beat the target's linear probe, and with which recipe?

The share of the gap a transfer closes, ``(acc - probe) / (finetuned - probe)``, only means something when the gap
``finetuned - probe`` is large against the noise of either end. Before any transfer is judged, the pilot fixes the
resolution, the task, the training-set size and the fine-tuning recipe of each family of real pairs **on validation
data only**:

1. :func:`premise_point` fits each encoder's linear probe and fine-tunes it through that frozen probe with one
   candidate recipe (learning rate x epochs of :func:`~ftlab.experiments.transfer_accuracy.finetune.recipe`), and
   records the validation and test accuracy of both;
2. :func:`choose_recipes` picks, per (family, task, training-set size), the recipe with the best mean *validation*
   accuracy of the fine-tuned target models, among the recipes every target was tried with (one recipe for every
   model of a family, as the benchmark shares it), and
   marks a task whose validation gap ``finetuned - probe`` is below :data:`MIN_GAP` on any target encoder: such a
   task is dropped from the benchmark (the premise fails).

Test accuracies are recorded beside the validation ones so that the measured gaps can be stated, but no choice
reads them.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import pandas as pd
import torch

from ftlab.core.validate import check_choice
from ftlab.experiments.training import accuracy
from ftlab.experiments.transfer_accuracy.finetune import recipe

__all__ = ["MIN_GAP", "PILOT_RECIPES", "PremiseCase", "choose_recipes", "pilot_points", "premise_point"]

#: Direct fine-tuning must beat the target's linear probe by at least this much (accuracy, on validation).
MIN_GAP = 0.10

#: Candidate recipes per family: ``(lr, epochs)`` of momentum SGD with warm-up + cosine, head frozen.
PILOT_RECIPES: dict[str, tuple[tuple[float, int], ...]] = {
    "vision": ((0.01, 5), (0.03, 5), (0.1, 5)),
    "text": ((0.01, 4), (0.03, 4), (0.1, 4)),
}


@dataclass(frozen=True)
class PremiseCase:
    """One pilot point: ``encoder`` of a ``kind`` (``vision`` / ``text``) family on ``task`` with one candidate recipe
    (``lr``, ``epochs`` of :func:`~ftlab.experiments.transfer_accuracy.finetune.recipe`) and ``seed``; ``n_train``,
    ``n_val``, ``n_test`` examples; ``size`` the image resolution (px) or the text length (tokens)."""

    kind: str
    encoder: str
    task: str
    lr: float
    epochs: int
    seed: int
    n_train: int = 500
    n_val: int = 200
    n_test: int = 500
    size: int = 64

    def __post_init__(self):
        check_choice("kind", self.kind, tuple(PILOT_RECIPES))


def premise_point(**case) -> dict:
    """One :class:`PremiseCase` (a sweep point, its fields as keywords): validation and test accuracy of the linear
    probe and of the fine-tuned model (fractions in [0, 1]) and the wall time."""
    # here, not at the top: the set-up imports claims, which imports MIN_GAP from this module
    from ftlab.experiments.transfer_accuracy.setup import probed_and_tuned, real_task, text_recipe

    c = PremiseCase(**case)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    d = real_task(c.kind, c.task, seed=c.seed, n_train=c.n_train, n_val=c.n_val, n_test=c.n_test, size=c.size)
    cfg = recipe(lr=c.lr, epochs=c.epochs)
    models = probed_and_tuned(c.encoder, d, text_recipe(cfg) if c.kind == "text" else cfg, c.seed)
    out: dict = {}
    for name, model in zip(("probe", "finetuned"), models):
        for split, (x, y) in (("val", (d.x_val, d.y_val)), ("test", (d.x_test, d.y_test))):
            out[f"{name}_{split}"] = accuracy(model, x, y, batch_size=256)
    return {**out, "seconds": time.perf_counter() - t0}


def pilot_points(kind: str, encoders, tasks, *, seeds=(0,), n_train=(500,), recipes=None, **sizes) -> list[dict]:
    """The sweep points of a pilot (every encoder x task x training-set size x recipe x seed) as
    :class:`PremiseCase` dicts; ``sizes``: the fixed ``n_val``, ``n_test`` and ``size`` (defaults: the case's)."""
    unknown = sorted(set(sizes) - {"n_val", "n_test", "size"})
    if unknown:
        raise ValueError(f"unknown pilot size {unknown[0]!r}: give n_val, n_test or size")
    recipes = PILOT_RECIPES[kind] if recipes is None else recipes
    return [dataclasses.asdict(PremiseCase(kind, e, t, float(lr), int(ep), int(s), int(n), **sizes))
            for t in tasks for n in n_train for e in encoders for lr, ep in recipes for s in seeds]


def choose_recipes(df: pd.DataFrame, targets: dict[str, tuple[str, ...]]) -> pd.DataFrame:
    """Per (kind, task, n_train): the recipe with the best mean validation accuracy of the fine-tuned targets, its
    validation and test gaps per target encoder, and whether the premise holds (every target's validation gap >=
    :data:`MIN_GAP`). ``targets[kind]``: the encoders that are targets of a pair (whose gap the premise needs)."""
    rows = []
    for (kind, task, n), g in df.groupby(["kind", "task", "n_train"], sort=False):
        tg_all = [e for e in targets.get(kind, ()) if e in set(g["encoder"])]
        on_targets = g[g["encoder"].isin(tg_all)]
        if not len(on_targets):
            continue
        runs = on_targets.groupby(["lr", "epochs"])["encoder"].nunique()
        common = runs[runs == len(tg_all)].index  # recipes every target was fine-tuned with
        by = on_targets.set_index(["lr", "epochs"]).loc[common].groupby(level=["lr", "epochs"])["finetuned_val"].mean()
        lr, ep = by.idxmax()
        best = g[(g["lr"] == lr) & (g["epochs"] == ep)]
        per = best.groupby("encoder")[["probe_val", "finetuned_val", "probe_test", "finetuned_test"]].mean()
        tg = [e for e in targets.get(kind, ()) if e in per.index]
        gaps_val = {e: float(per.loc[e, "finetuned_val"] - per.loc[e, "probe_val"]) for e in tg}
        gaps_test = {e: float(per.loc[e, "finetuned_test"] - per.loc[e, "probe_test"]) for e in tg}
        rows.append({"kind": kind, "task": task, "n_train": int(n), "lr": float(lr), "epochs": int(ep),
                     "seeds": int(best["seed"].nunique()), "gap_val": gaps_val, "gap_test": gaps_test,
                     "min_gap_val": min(gaps_val.values()) if gaps_val else float("nan"),
                     "premise": bool(gaps_val) and min(gaps_val.values()) >= MIN_GAP})
    return pd.DataFrame(rows)
