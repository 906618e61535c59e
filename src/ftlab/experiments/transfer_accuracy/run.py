"""The benchmark driver: every setting x task x seed, every method, alpha fixed and searched.

For one (source base A, target base B, task, seed):

1. fine-tune A on the task's training draw -> ``A_ft`` (:mod:`~ftlab.experiments.transfer_accuracy.finetune`);
2. fine-tune B with the same recipe -> ``B_ft`` (the upper bound, method ``finetuned``);
3. read B zero-shot (method ``zero_shot``);
4. for every registered method that applies (``gradfix`` and ``identity`` need equal shapes),
   ``tau_B = ftlab.transfer.transfer(A, A_ft, B, cal_batches, loss, method=...)`` with ``n_cal``
   calibration samples drawn (by seed) from the training draw, the loss being each model's
   cross-entropy through its own frozen head; then the accuracy of ``B + alpha tau_B`` at
   ``alpha = 1`` (``alpha_mode="fixed"``) and at the alpha chosen on the validation split by
   :func:`ftlab.transfer.search_alpha` over the same grid for every method (``"searched"``);
5. BiCo again at every calibration size of ``cal_sizes`` (``alpha_mode`` both ways).

Each (task, seed) of the vision settings and each seed of the text pair is one point of a
resumable :func:`ftlab.core.sweep.run_sweep`; the result is one tidy row per
(setting, task, seed, method, alpha_mode, n_cal) with the test accuracy.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ftlab.core.validate import check_choice, check_int
from ftlab.experiments.training import TrainConfig
from ftlab.experiments.transfer_accuracy.finetune import recipe

__all__ = ["BenchmarkConfig", "quick_config", "full_config", "evaluate_transfers", "vision_point", "text_point",
           "benchmark_point", "run_benchmark", "TRANSFER_METHODS"]

log = logging.getLogger(__name__)

#: Methods compared in the table (short names as registered in ftlab.transfer); ``identity`` equals
#: ``naive`` whenever it applies (same shapes), so it is not repeated.
TRANSFER_METHODS: tuple[str, ...] = ("naive", "activation_only", "gradient_only", "gradfix", "bico")
#: Text fine-tuning also freezes the 30522 x 384 word-embedding table: its delta would be sparse (only the
#: tokens of a few hundred glosses) and transporting it costs a vocabulary-sized identity map; with it frozen,
#: zeroing its (exactly zero) delta in the transfer loses nothing.
TEXT_FROZEN: tuple[str, ...] = ("head", "encoder.embeddings.word_embeddings")
TEXT_TASK = "wordnet_supersense"
_GRID_FULL = tuple(round(0.1 * i, 10) for i in range(1, 31))
_GRID_QUICK = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0)


@dataclass(frozen=True)
class BenchmarkConfig:
    """Everything that defines a benchmark run (saved next to its results).

    tasks / settings / seeds : vision tasks (:data:`~ftlab.experiments.transfer_accuracy.tasks.TASKS`),
        settings (:data:`~ftlab.experiments.transfer_accuracy.family.SETTINGS`) and seeds (each seed redraws the
        training set, the fine-tuning order and the calibration samples).
    n_train, n_val, n_test : vision split sizes (images).
    n_cal : calibration samples of the main table; cal_sizes : BiCo's calibration-size sweep
        (run in ``cal_settings`` only); cal_batch_size : calibration batch size.
    alpha_grid : the alpha grid searched on the validation split (the same for every method).
    methods : transfer methods compared.
    vision_finetune / text_finetune : recipes (the source's and the directly fine-tuned target's).
    text : run the MiniLM-L6 -> MiniLM-L3 pair; text_* : its sizes and grid.
    """

    tasks: tuple[str, ...] = ("mnist_rot90", "fashion_invert", "mnist_noise", "digits", "fashion_tops_rot180")
    settings: tuple[str, ...] = ("width", "depth", "pretraining")
    seeds: tuple[int, ...] = (0, 1, 2)
    n_train: int = 500
    n_val: int = 300
    n_test: int = 2000
    n_cal: int = 100
    cal_sizes: tuple[int, ...] = (10, 30, 100, 300)
    cal_settings: tuple[str, ...] = ("width",)
    cal_batch_size: int = 32
    alpha_grid: tuple[float, ...] = _GRID_FULL
    methods: tuple[str, ...] = TRANSFER_METHODS
    vision_finetune: TrainConfig = recipe(lr=0.03, epochs=5)
    text: bool = True
    text_seeds: tuple[int, ...] = (0, 1, 2)
    text_n_classes: int = 8
    text_n_train: int = 400
    text_n_val: int = 200
    text_n_test: int = 800
    text_cal_sizes: tuple[int, ...] = (10, 30, 100, 300)
    text_alpha_grid: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
    text_finetune: TrainConfig = recipe(lr=0.01, epochs=4)
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        from ftlab.experiments.transfer_accuracy.family import SETTINGS
        from ftlab.experiments.transfer_accuracy.tasks import TASKS

        for t in self.tasks:
            check_choice("task", t, list(TASKS))
        for s in (*self.settings, *self.cal_settings):
            check_choice("setting", s, list(SETTINGS))
        for k in ("n_train", "n_val", "n_test", "n_cal", "cal_batch_size"):
            check_int(k, getattr(self, k), 1)
        for n in (*self.cal_sizes, *self.text_cal_sizes):
            check_int("cal_sizes", n, 1)
        if self.n_cal > self.n_train or max(self.cal_sizes, default=0) > self.n_train:
            raise ValueError(f"n_cal={max(self.n_cal, *self.cal_sizes)} is out of range: must be <= n_train={self.n_train}")
        if not self.seeds or not self.alpha_grid:
            raise ValueError("seeds and alpha_grid must not be empty")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> BenchmarkConfig:
        d = dict(d)
        for k in ("vision_finetune", "text_finetune"):
            if isinstance(d.get(k), dict):
                d[k] = TrainConfig(**{**d[k], "frozen": tuple(d[k].get("frozen", ("head",)))})
        for k, v in list(d.items()):
            if isinstance(v, list):
                d[k] = tuple(v)
        return cls(**d)


def quick_config() -> BenchmarkConfig:
    """The default of ``ftlab reproduce transfer`` (< 15 min on 2 cores with a warm cache):
    4 tasks, 3 seeds, all three vision settings, the text pair; calibration sweep in the width setting."""
    return BenchmarkConfig(tasks=("mnist_rot90", "fashion_invert", "digits", "fashion_tops_rot180"), n_test=1000,
                           alpha_grid=_GRID_QUICK, cal_sizes=(10, 30, 100, 300), text_n_train=300, text_n_test=600,
                           text_cal_sizes=(30, 100), text_alpha_grid=(0.5, 1.0, 1.5, 2.0, 3.0))


def full_config() -> BenchmarkConfig:
    """``--full``: 5 tasks, 5 seeds, 1000 training images, the fine 0.1-step alpha grid."""
    return BenchmarkConfig(seeds=(0, 1, 2, 3, 4), n_train=1000, n_val=500, n_test=5000, text_seeds=(0, 1, 2, 3, 4))


def _record(setting, task, seed, method, mode, alpha, n_cal, acc, seconds=float("nan")) -> dict:
    return {"setting": setting, "task": task, "seed": seed, "method": method, "alpha_mode": mode,
            "alpha": float(alpha), "n_cal": int(n_cal), "accuracy": float(acc), "seconds": float(seconds)}


def evaluate_transfers(*, setting: str, task: str, seed: int, source_base, source_ft, target_base, target_ft,
                       cal_pool: tuple, loss: Callable, score: Callable[[object, str], float],
                       methods: Sequence[str], n_cal: int, cal_sizes: Sequence[int] = (), alpha_grid: Sequence[float],
                       cal_batch_size: int = 32, transfer_options: dict | None = None) -> list[dict]:
    """Rows for one (setting, task, seed): zero-shot, fine-tuned, every method at alpha=1 and searched.

    cal_pool : ``(inputs, labels)`` from which calibration samples are drawn (by ``seed``);
    loss : ``loss(model, batch)`` through each model's own frozen head;
    score : ``score(model, split)`` with ``split`` in ``{"val", "test"}`` -> accuracy;
    methods : registered short names; a method that does not apply to these shapes (ValueError
        from ``ftlab.transfer``) is skipped and logged.
    """
    from ftlab.experiments.transfer_accuracy.finetune import batches_of
    from ftlab.transfer import TaskVector, transfer
    from ftlab.transfer.align import RankWarning
    from ftlab.transfer.evaluate import search_alpha

    opts = dict(transfer_options or {})
    rows = [_record(setting, task, seed, "zero_shot", mode, np.nan, n_cal, score(target_base, "test"))
            for mode in ("fixed", "searched")]
    ft_acc = score(target_ft, "test")
    rows += [_record(setting, task, seed, "finetuned", mode, np.nan, n_cal, ft_acc) for mode in ("fixed", "searched")]
    runs = [(m, n_cal) for m in methods] + [("bico", n) for n in cal_sizes if n != n_cal or "bico" not in methods]
    for method, n in runs:
        batches = batches_of(cal_pool[0], cal_pool[1], batch_size=cal_batch_size, n=n, seed=seed)
        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings():  # expected at small n_cal; the calibration sweep shows it
                warnings.simplefilter("ignore", RankWarning)
                tau = transfer(source_base, source_ft, target_base, batches, loss, method=method, **opts)
        except ValueError as exc:
            log.info("%s/%s: method %s skipped: %s", setting, task, method, exc)
            continue
        seconds = time.perf_counter() - t0
        rows.append(_record(setting, task, seed, method, "fixed", 1.0, n, score(tau.apply(target_base, 1.0), "test"),
                            seconds))
        def val_score(a: float, tau: TaskVector = tau) -> float:
            return score(tau.apply(target_base, a), "val")

        best, _ = search_alpha(val_score, grid=alpha_grid)
        rows.append(_record(setting, task, seed, method, "searched", best, n, score(tau.apply(target_base, best), "test"),
                            seconds))
    return rows


def vision_point(task: str, seed: int, config: dict, cache: str | None = None) -> list[dict]:
    """All vision settings for one (task, seed) (a :func:`ftlab.core.sweep.run_sweep` point)."""
    import torch

    from ftlab.experiments.training import accuracy
    from ftlab.experiments.transfer_accuracy.family import SETTINGS, load_base
    from ftlab.experiments.transfer_accuracy.finetune import finetune, task_loss
    from ftlab.experiments.transfer_accuracy.tasks import TASKS, load_task

    torch.set_num_threads(1)
    cfg = BenchmarkConfig.from_dict(config)
    d = load_task(task, n_train=cfg.n_train, n_val=cfg.n_val, n_test=cfg.n_test, seed=seed)
    classes = TASKS[task].joint_classes
    t = torch.from_numpy
    splits = {"train": (t(d.x_train), t(d.y_train)), "val": (t(d.x_val), t(d.y_val)), "test": (t(d.x_test), t(d.y_test))}

    def score(model, split):
        return accuracy(model, *splits[split], classes=classes)

    loss = task_loss(classes)
    bases: dict = {}
    fts: dict = {}

    def base(name):
        if name not in bases:
            bases[name] = load_base(name, cache=cache)[0]
            fts[name] = finetune(bases[name], *splits["train"], classes, config=cfg.vision_finetune, seed=seed)
        return bases[name], fts[name]

    rows = []
    for setting in cfg.settings:
        src, tgt = SETTINGS[setting]
        a, a_ft = base(src)
        b, b_ft = base(tgt)
        rows += evaluate_transfers(
            setting=setting, task=task, seed=seed, source_base=a, source_ft=a_ft, target_base=b, target_ft=b_ft,
            cal_pool=splits["train"], loss=loss, score=score, methods=cfg.methods, n_cal=cfg.n_cal,
            cal_sizes=cfg.cal_sizes if setting in cfg.cal_settings else (), alpha_grid=cfg.alpha_grid,
            cal_batch_size=cfg.cal_batch_size)
    return rows


def text_point(seed: int, config: dict) -> list[dict]:
    """The text pair (MiniLM-L6 -> MiniLM-L3, WordNet supersenses) for one seed, scored by linear probing."""
    import torch

    from ftlab.data.text import load_minilm_l3, load_minilm_l6
    from ftlab.experiments.transfer_accuracy.finetune import finetune, task_loss
    from ftlab.experiments.transfer_accuracy.text import TextClassifier, fit_probe, load_text_task, probe_accuracy
    from ftlab.transfer import DEFAULT_ZERO

    torch.set_num_threads(1)
    cfg = BenchmarkConfig.from_dict(config)
    enc_a, tok = load_minilm_l6()
    enc_b, _ = load_minilm_l3()
    d = load_text_task(tok, n_classes=cfg.text_n_classes, n_train=cfg.text_n_train, n_val=cfg.text_n_val,
                       n_test=cfg.text_n_test, seed=seed)
    classes = range(len(d.classes))
    a = TextClassifier(enc_a, fit_probe(enc_a, d.probe_inputs, d.y_probe))
    b = TextClassifier(enc_b, fit_probe(enc_b, d.probe_inputs, d.y_probe))
    recipe = dataclasses.replace(cfg.text_finetune, frozen=tuple(dict.fromkeys((*cfg.text_finetune.frozen, *TEXT_FROZEN))))
    a_ft = finetune(a, d.train_inputs, d.y_train, classes, config=recipe, seed=seed)
    b_ft = finetune(b, d.train_inputs, d.y_train, classes, config=recipe, seed=seed)
    held = {"val": (d.val_inputs, d.y_val), "test": (d.test_inputs, d.y_test)}

    def score(model, split):
        return probe_accuracy(model, d.train_inputs, d.y_train, *held[split])

    return evaluate_transfers(
        setting="text", task=TEXT_TASK, seed=seed, source_base=a, source_ft=a_ft, target_base=b, target_ft=b_ft,
        cal_pool=(d.train_inputs, d.y_train), loss=task_loss(classes), score=score, methods=cfg.methods,
        n_cal=min(cfg.n_cal, cfg.text_n_train), cal_sizes=[n for n in cfg.text_cal_sizes if n <= cfg.text_n_train],
        alpha_grid=cfg.text_alpha_grid, cal_batch_size=cfg.cal_batch_size,
        transfer_options={"padding_mask": lambda batch: batch[0]["attention_mask"],
                          "zero_params": (*DEFAULT_ZERO, "*word_embeddings*")})


def run_benchmark(config: BenchmarkConfig, *, store=None, cache=None, workers: int | None = None, scheduler=None):
    """Pretrain (or read from the cache) every base, then run all points; return the tidy DataFrame.

    store : JSON-lines file of finished points (a rerun resumes); cache : the base-model cache folder
    (default ``$FTLAB_CACHE`` or ``~/.cache/ftlab``); workers / scheduler : see :func:`ftlab.core.sweep.run_sweep`.
    """
    from ftlab.core.sweep import grid, run_sweep
    from ftlab.experiments.transfer_accuracy.family import SETTINGS

    cache = None if cache is None else str(cache)
    names = sorted({n for s in (*config.settings, *config.cal_settings) for n in SETTINGS[s]})
    pre_store = None if store is None else str(store) + ".pretrain.jsonl"
    pre = run_sweep(pretrain_point, grid(name=names, cache=[cache]), store=pre_store, workers=workers,
                    scheduler=scheduler, desc="pretrain bases")
    conf = config.to_dict()
    # one pool for all points, the slow text points first, so that both workers stay busy to the end
    points = [{"kind": "text", "task": TEXT_TASK, "seed": s, "config": conf, "cache": cache}
              for s in (config.text_seeds if config.text else ())]
    points += [{"kind": "vision", "task": t, "seed": s, "config": conf, "cache": cache}
               for t in config.tasks for s in config.seeds]
    df = run_sweep(benchmark_point, points, store=store, workers=workers, scheduler=scheduler, desc="transfer benchmark")
    df = df.drop(columns=[c for c in ("kind", "config", "cache") if c in df.columns])
    df.attrs["pretraining"] = pre.drop(columns=["cache"]).to_dict(orient="records")
    return df


def benchmark_point(kind: str, task: str, seed: int, config: dict, cache: str | None = None) -> list[dict]:
    """One sweep point: :func:`vision_point` (``kind="vision"``) or :func:`text_point` (``kind="text"``)."""
    check_choice("kind", kind, ("vision", "text"))
    return vision_point(task, seed, config, cache) if kind == "vision" else text_point(seed, config)


def pretrain_point(name: str, cache: str | None = None) -> dict:
    """Build (or read) one base of the family; its metrics (a sweep point)."""
    import torch

    from ftlab.experiments.transfer_accuracy.family import load_base

    torch.set_num_threads(1)
    _, metrics = load_base(name, cache=cache)
    return {"base": name, **metrics}
