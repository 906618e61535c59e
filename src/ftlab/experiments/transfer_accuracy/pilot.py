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

import pandas as pd

from ftlab.core.validate import check_choice

__all__ = ["MIN_GAP", "PILOT_RECIPES", "choose_recipes", "pilot_points", "premise_point"]

#: Direct fine-tuning must beat the target's linear probe by at least this much (accuracy, on validation).
MIN_GAP = 0.10

#: Candidate recipes per family: ``(lr, epochs)`` of momentum SGD with warm-up + cosine, head frozen.
PILOT_RECIPES: dict[str, tuple[tuple[float, int], ...]] = {
    "vision": ((0.01, 5), (0.03, 5), (0.1, 5)),
    "text": ((0.01, 4), (0.03, 4), (0.1, 4)),
}


def _data(kind: str, task: str, seed: int, n_train: int, n_val: int, n_test: int, size: int):
    if kind == "vision":
        from ftlab.experiments.transfer_accuracy.vision import load_image_task

        return load_image_task(task, n_train=n_train, n_val=n_val, n_test=n_test, seed=seed, resolution=size)
    from ftlab.experiments.transfer_accuracy.pairs import text_tokenizer
    from ftlab.experiments.transfer_accuracy.text import load_text_task

    return load_text_task(task, text_tokenizer(), n_train=n_train, n_val=n_val, n_test=n_test, max_length=size,
                          seed=seed)


def premise_point(kind: str, encoder: str, task: str, lr: float, epochs: int, seed: int, n_train: int, n_val: int,
                  n_test: int, size: int) -> dict:
    """One encoder, task, recipe and seed: validation and test accuracy of the linear probe and of the fine-tuned
    model (fractions in [0, 1]); ``size`` is the image resolution (px) or the text length (tokens)."""
    import torch

    from ftlab.experiments.training import accuracy
    from ftlab.experiments.transfer_accuracy.finetune import finetune, recipe
    from ftlab.experiments.transfer_accuracy.pairs import load_encoder
    from ftlab.experiments.transfer_accuracy.probe import ProbeClassifier, fit_probe_head
    from ftlab.experiments.transfer_accuracy.run import TEXT_FROZEN

    check_choice("kind", kind, ("vision", "text"))
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    d = _data(kind, task, seed, n_train, n_val, n_test, size)
    enc = load_encoder(encoder)
    base = ProbeClassifier(enc, fit_probe_head(enc, d.x_train, d.y_train, n_classes=d.n_classes)).eval()
    cfg = recipe(lr=lr, epochs=epochs)
    if kind == "text":
        cfg = dataclasses.replace(cfg, frozen=tuple(dict.fromkeys((*cfg.frozen, *TEXT_FROZEN))))
    ft = finetune(base, d.x_train, d.y_train, range(d.n_classes), config=cfg, seed=seed)
    out: dict = {}
    for name, model in (("probe", base), ("finetuned", ft)):
        for split, (x, y) in (("val", (d.x_val, d.y_val)), ("test", (d.x_test, d.y_test))):
            out[f"{name}_{split}"] = accuracy(model, x, y, batch_size=256)
    return {**out, "seconds": time.perf_counter() - t0}


def pilot_points(kind: str, encoders, tasks, *, seeds=(0,), n_train=(500,), n_val: int = 200, n_test: int = 500,
                 size: int = 64, recipes=None) -> list[dict]:
    """The sweep points of a pilot (every encoder x task x training-set size x recipe x seed)."""
    recipes = PILOT_RECIPES[kind] if recipes is None else recipes
    return [{"kind": kind, "encoder": e, "task": t, "lr": float(lr), "epochs": int(ep), "seed": int(s),
             "n_train": int(n), "n_val": n_val, "n_test": n_test, "size": size}
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
