"""The benchmark's run: sweep points over real pretrained pairs and the controlled ViT family.

For one source encoder A and target encoder B, one task and one seed, a point builds the pair
(:class:`~ftlab.experiments.transfer_accuracy.setup.TaskSetup`: each model's head, its fine-tuning ``A_ft`` / ``B_ft``)
and runs every transfer of the design's plan on it
(:func:`~ftlab.experiments.transfer_accuracy.compare.evaluate_pair`): for each calibration set (``n100``: 100
samples drawn by seed from the training draw; ``k5``: 5 per class) and each planned method,
``tau_B = fit_transfer(A, A_ft, B, batches, loss)``, the loss being each model's cross-entropy through its own
frozen head; the test accuracy of ``B + alpha tau_B`` at ``alpha = 1`` (``alpha_mode="fixed"``) and at the alpha
chosen on the validation split over the same grid for every method (``"searched"``); ``B_ft`` is the upper bound
(method ``finetuned``), ``B`` itself the lower bound (``probe``; ``zero_shot`` for the ViT family). BiCo's fit on
the first calibration set also records per capture point the alignment of the two bases and the share of
``||tau_A||^2`` of the paired source layer (``record="layer"``), and the diagnostic's estimate of the share of the
task vector that carries over (``record="estimate"``).

Points of one resumable :func:`ftlab.core.sweep.run_sweep` (:meth:`BenchmarkConfig.points`): ``("vision", task,
seed)`` runs every EfficientNet pair (each model fine-tuned once; with ``split_vision_pairs`` one point per pair,
which balances two workers better at the cost of fine-tuning a shared model twice), ``("text", pair, task, seed)``
one text pair, ``("family", task, seed)`` every controlled ViT setting. Every point sets
``torch.set_num_threads(1)`` and draws everything from its seed, so a point's rows do not depend on the machine's
thread count or on which worker ran it. The design itself is :mod:`~ftlab.experiments.transfer_accuracy.design`
(its names are importable from here too).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pandas as pd
import torch

from ftlab.core.sweep import grid, run_sweep
from ftlab.core.validate import check_choice
from ftlab.data import DatasetMissing
from ftlab.data.weights import mpnet_part_paths
from ftlab.experiments.transfer_accuracy import family
from ftlab.experiments.transfer_accuracy.compare import evaluate_pair
from ftlab.experiments.transfer_accuracy.design import (
    ALPHA_GRID,
    TEXT_DESIGN,
    VISION_DESIGN,
    BenchmarkConfig,
    full_config,
    quick_config,
    tiny_config,
)
from ftlab.experiments.transfer_accuracy.setup import KINDS, TaskSetup

__all__ = ["ALPHA_GRID", "TEXT_DESIGN", "VISION_DESIGN", "BenchmarkConfig", "available_text_pairs", "benchmark_point",
           "family_point", "full_config", "pretrain_point", "quick_config", "run_benchmark", "text_point",
           "tiny_config", "vision_point"]

log = logging.getLogger(__name__)


def _evaluate(setup: TaskSetup, setting: str, plan: dict) -> list[dict]:
    cfg = setup.cfg.settings
    models, data = setup.pair(setting)
    return evaluate_pair(models, data, plan, alpha_grid=cfg.alpha_grid, cal_batch_size=cfg.cal_batch_size,
                         diagnose=cfg.diagnose)


def vision_point(task: str, seed: int, config: dict, pair: str = "") -> list[dict]:
    """Every EfficientNet pair for one (task, seed) (only ``pair`` if given); a model shared by two pairs is probed
    and fine-tuned once."""
    cfg = BenchmarkConfig.from_dict(config)
    setup = TaskSetup("vision", task, seed, cfg)
    return [r for name in ([pair] if pair else cfg.vision.vision_pairs)
            for r in _evaluate(setup, name, cfg.calibration_plan(task, name))]


def text_point(pair: str, task: str, seed: int, config: dict) -> list[dict]:
    """One text pair on one (task, seed), read through linear-probe heads."""
    cfg = BenchmarkConfig.from_dict(config)
    return _evaluate(TaskSetup("text", task, seed, cfg, pair=pair), pair, cfg.calibration_plan(task, pair))


def family_point(task: str, seed: int, config: dict, cache: str | None = None) -> list[dict]:
    """Every controlled-family setting for one (task, seed), read zero-shot through the pretrained 20-class head."""
    cfg = BenchmarkConfig.from_dict(config)
    setup = TaskSetup("family", task, seed, cfg, cache=cache)
    return [r for setting in cfg.family.family_settings for r in _evaluate(setup, setting, cfg.family_plan(task))]


def benchmark_point(kind: str, pair: str, task: str, seed: int, config: dict, cache: str | None = None) -> list[dict]:
    """One sweep point (see the module docstring)."""
    check_choice("kind", kind, KINDS)
    if kind == "vision":
        return vision_point(task, seed, config, pair)
    if kind == "text":
        return text_point(pair, task, seed, config)
    return family_point(task, seed, config, cache)


def pretrain_point(name: str, cache: str | None = None) -> dict:
    """Build (or read) one base of the controlled family; its metrics (a sweep point)."""
    torch.set_num_threads(1)
    _, metrics = family.load_base(name, cache=cache)
    return {"base": name, **metrics}


def available_text_pairs(pairs: Sequence[str]) -> list[str]:
    """The text pairs whose weights are installed (all-mpnet-base-v2 is optional: ``make data-full``)."""
    out = []
    for p in pairs:
        if "mpnet" in p:
            try:
                mpnet_part_paths()
            except DatasetMissing as exc:
                log.warning("%s skipped: %s", p, exc)
                continue
        out.append(p)
    return out


def _pretrain_bases(config: BenchmarkConfig, *, store, cache, workers, scheduler) -> list[dict]:
    """Build (or read) the controlled bases the settings use, parents first; their metrics."""
    used = {n for s in config.family.family_settings for n in family.SETTINGS[s]}
    parents = {p for p in (family.FAMILY[n].parent for n in used) if p is not None}
    names = sorted(used | parents)
    if not names:
        return []
    pre_store = None if store is None else str(store) + ".pretrain.jsonl"
    frames = []
    for desc, stage in (("pretrain bases", [n for n in names if family.FAMILY[n].parent is None]),
                        ("derive bases", [n for n in names if family.FAMILY[n].parent is not None])):
        if stage:
            frames.append(run_sweep(pretrain_point, grid(name=stage, cache=[cache]), store=pre_store, workers=workers,
                                    scheduler=scheduler, desc=desc))
    return pd.concat(frames, ignore_index=True).drop(columns=["cache"]).to_dict(orient="records")


def run_benchmark(config: BenchmarkConfig, *, store=None, cache=None, workers: int | None = None, scheduler=None):
    """Build (or read) the controlled bases, then run every point; return the tidy DataFrame of all records.

    store : JSON-lines file of finished points (a rerun resumes); cache : the base-model cache folder;
    workers / scheduler : see :func:`ftlab.core.sweep.run_sweep`. Text pairs whose weights are not installed
    are left out (``df.attrs["skipped_pairs"]``).
    """
    cache = None if cache is None else str(cache)
    pretraining = _pretrain_bases(config, store=store, cache=cache, workers=workers, scheduler=scheduler)
    text_ok = available_text_pairs(config.text.text_pairs)
    points = config.points(text_available=text_ok)
    for p in points:
        p["cache"] = cache
    df = run_sweep(benchmark_point, points, store=store, workers=workers, scheduler=scheduler, desc="transfer benchmark")
    df = df.drop(columns=[c for c in ("kind", "config", "cache", "pair") if c in df.columns])
    df.attrs["pretraining"] = pretraining
    df.attrs["skipped_pairs"] = [p for p in config.text.text_pairs if p not in text_ok]
    return df
