"""The benchmark driver: real pretrained pairs and the controlled ViT family, every method, alpha fixed and searched.

For one source encoder A and target encoder B, one task and one seed (:func:`evaluate_pair`):

1. each encoder gets a frozen linear-probe head fitted on its own features of the task's training
   draw (:mod:`~ftlab.experiments.transfer_accuracy.probe`; the controlled ViTs keep their pretrained
   20-class head and read a task's rows of it, their "zero-shot" head);
2. A and B are fine-tuned through their frozen heads with the same recipe -> ``A_ft`` and ``B_ft``
   (``B_ft`` is the upper bound, method ``finetuned``; ``B`` itself is the lower bound, method
   ``probe`` -- ``zero_shot`` for the ViT family);
3. for each calibration set (``n100``: 100 samples drawn by seed from the training draw; ``k5``: 5
   per class) and each registered method, ``tau_B = fit_transfer(A, A_ft, B, batches, loss)``, the loss
   being each model's cross-entropy through its own frozen head; the test accuracy of ``B + alpha
   tau_B`` at ``alpha = 1`` (``alpha_mode="fixed"``) and at the alpha chosen on the validation split
   over the same grid for every method (``"searched"``);
4. BiCo's fit on ``n100`` also records, per capture point of B, the CKA of the two bases'
   calibration inputs and output gradients, the map ranks and the share of ``||tau_A||^2`` carried by
   the paired source layer (``record="layer"`` rows), and the transfer diagnostic's estimate of the
   share of the task vector that carries over (``record="estimate"``), when the library provides one.

Points of one resumable :func:`ftlab.core.sweep.run_sweep`: ``("vision", task, seed)`` runs every
EfficientNet pair (each model fine-tuned once; with ``split_vision_pairs`` one point per pair, which balances
two workers better at the cost of fine-tuning a shared model twice), ``("text", pair, task, seed)`` one text pair,
``("family", task, seed)`` every controlled ViT setting. Every point sets ``torch.set_num_threads(1)``
and draws everything from its seed, so a point's rows do not depend on the machine's thread count
or on which worker ran it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ftlab.core.validate import check_choice, check_int
from ftlab.experiments.training import TrainConfig
from ftlab.experiments.transfer_accuracy.claims import HELD_OUT
from ftlab.experiments.transfer_accuracy.finetune import recipe

__all__ = ["ALPHA_GRID", "BenchmarkConfig", "Prepared", "benchmark_point", "family_point", "full_config",
           "prepare", "quick_config", "run_benchmark", "setting_name", "text_point", "tiny_config", "vision_point"]

log = logging.getLogger(__name__)

#: Calibration sets: 100 samples drawn at random from the training draw, or 5 per class (the paper's two regimes).
CALIBRATIONS: tuple[str, ...] = ("n100", "k5")
#: The alpha grid searched on validation for every method: 0 (the target untouched) to 3 in steps of 0.5.
ALPHA_GRID: tuple[float, ...] = tuple(0.5 * i for i in range(7))
#: Text fine-tuning keeps the word-embedding table and MPNet's relative attention bias frozen (the source's converted
#: bias is zero and has no counterpart in a BERT source): their deltas are exactly zero.
TEXT_FROZEN: tuple[str, ...] = ("head", "encoder.model.embeddings.word_embeddings",
                                 "encoder.model.encoder.relative_attention_bias")
_SEED_FIELDS = ("seeds", "text_seeds", "heavy_seeds", "family_seeds")


def setting_name(pair: str, task: str, held_out: Sequence[str]) -> str:
    """The setting a pair's rows are recorded under: the pair, with :data:`HELD_OUT` on a held-out task."""
    return pair + HELD_OUT if task in held_out else pair


@dataclass(frozen=True)
class BenchmarkConfig:
    """Everything that defines a benchmark run (saved next to its results).

    Real vision pairs: ``vision_pairs`` (:data:`~ftlab.experiments.transfer_accuracy.pairs.PAIRS`) on
    ``image_tasks`` at ``resolution`` px, ``seeds``; ``n_train`` (fine-tuning set = probe set =
    calibration pool), ``n_val`` (alpha search), ``n_test`` images; ``vision_finetune`` recipe.
    Real text pairs: ``text_pairs`` on ``text_tasks`` with ``text_seeds``, ``text_n_*`` glosses
    (``max_length`` tokens), ``text_finetune``.
    Controlled ViT family: ``family_settings``
    (:data:`~ftlab.experiments.transfer_accuracy.family.SETTINGS`) on ``family_tasks`` with
    ``family_seeds``, ``family_n_*`` images, ``family_finetune``.
    Methods (:meth:`plan`): ``methods`` on every task with the first calibration set; ``ablation_methods`` with
    it too, on ``ablation_tasks`` only (empty: every task) and, for real pairs, ``ablation_pairs`` only (empty: every
    pair); ``other_cal_methods`` with the other calibration sets (on real pairs only if ``other_cal_real``);
    ``heavy_methods`` (first calibration only) for the all-mpnet-base-v2 pair, on ``heavy_seeds`` (default: the
    text seeds) with ``heavy_n_val`` / ``heavy_n_test`` glosses (default: the text pairs');
    ``family_methods`` for the controlled family too (TransFusion: equal shapes only, skipped elsewhere).
    Held-out tasks: ``heldout_image_tasks`` / ``heldout_text_tasks`` are run on every real pair of their family with
    ``heldout_methods`` only (first calibration), their rows recorded under the setting ``pair + HELD_OUT``.
    Method names are registered methods or variants (:mod:`~ftlab.experiments.transfer_accuracy.variants`).
    ``split_vision_pairs``: one sweep point per (EfficientNet pair, task, seed) instead of per (task, seed).
    Transfer: ``calibrations`` (:data:`CALIBRATIONS`), ``cal_batch_size``, ``cal_loss`` (the
    calibration loss, :data:`~ftlab.experiments.transfer_accuracy.finetune.LOSS_KINDS`), ``alpha_grid``
    (searched on validation, the same for every method), ``transfer`` (options passed to every
    transfer: :class:`~ftlab.transfer.TransferOptions` fields and method options), ``vision_transfer`` /
    ``text_transfer`` (extra options for those pairs).
    """

    vision_pairs: tuple[str, ...] = ("lite0->lite1", "lite1->lite2", "lite0->lite2")
    image_tasks: tuple[str, ...] = ("mnist", "fashion", "digits", "fashion_tops", "mnist_noise")
    resolution: int = 32
    seeds: tuple[int, ...] = (0, 1, 2)
    n_train: int = 500
    n_val: int = 200
    n_test: int = 1000
    vision_finetune: TrainConfig = recipe(lr=0.03, epochs=5)
    text_pairs: tuple[str, ...] = ("minilm_l3->minilm_l6", "minilm_l6->mpnet_base")
    text_tasks: tuple[str, ...] = ("wordnet_nouns", "wordnet_verbs")
    text_seeds: tuple[int, ...] = (0, 1, 2)
    text_n_train: int = 400
    text_n_val: int = 200
    text_n_test: int = 600
    text_max_length: int = 24
    text_finetune: TrainConfig = recipe(lr=0.01, epochs=4)
    family_settings: tuple[str, ...] = ("permuted", "continued_1ep", "continued_4ep", "independent", "pretraining",
                                        "width", "depth")
    family_tasks: tuple[str, ...] = ("mnist_rot90", "fashion_invert", "digits", "fashion_tops_rot180")
    family_seeds: tuple[int, ...] = (0, 1, 2)
    family_n_train: int = 500
    family_n_val: int = 300
    family_n_test: int = 1000
    family_finetune: TrainConfig = recipe(lr=0.03, epochs=5)
    methods: tuple[str, ...] = ("naive", "activation_only", "bico")
    ablation_methods: tuple[str, ...] = ("bico_input_only", "bico_output_only", "gradient_only", "gradfix")
    ablation_tasks: tuple[str, ...] = ("fashion_tops", "mnist", "wordnet_nouns", "wordnet_verbs", "digits",
                                       "fashion_tops_rot180", "mnist_rot90", "fashion_invert")
    other_cal_methods: tuple[str, ...] = ("bico", "activation_only")
    heavy_methods: tuple[str, ...] = ("naive", "activation_only", "bico")
    calibrations: tuple[str, ...] = CALIBRATIONS
    cal_batch_size: int = 32
    alpha_grid: tuple[float, ...] = ALPHA_GRID
    cal_loss: str = "ce"
    transfer: dict = field(default_factory=dict)
    vision_transfer: dict = field(default_factory=dict)
    text_transfer: dict = field(default_factory=dict)
    diagnose: bool = True
    split_vision_pairs: bool = False
    ablation_pairs: tuple[str, ...] = ()
    family_methods: tuple[str, ...] = ("transfusion",)
    heavy_seeds: tuple[int, ...] | None = None
    heavy_n_val: int | None = None
    heavy_n_test: int | None = None
    heldout_image_tasks: tuple[str, ...] = ()
    heldout_text_tasks: tuple[str, ...] = ()
    heldout_methods: tuple[str, ...] = ()
    other_cal_real: bool = True

    def __post_init__(self):
        from ftlab.experiments.transfer_accuracy.family import SETTINGS
        from ftlab.experiments.transfer_accuracy.pairs import PAIRS
        from ftlab.experiments.transfer_accuracy.tasks import TASKS
        from ftlab.experiments.transfer_accuracy.text import TEXT_TASKS
        from ftlab.experiments.transfer_accuracy.vision import IMAGE_TASKS

        for p in self.vision_pairs:
            check_choice("vision pair", p, [k for k, v in PAIRS.items() if v.kind == "vision"])
        for p in self.text_pairs:
            check_choice("text pair", p, [k for k, v in PAIRS.items() if v.kind == "text"])
        for t in (*self.image_tasks, *self.heldout_image_tasks):
            check_choice("image task", t, list(IMAGE_TASKS))
        for t in (*self.text_tasks, *self.heldout_text_tasks):
            check_choice("text task", t, list(TEXT_TASKS))
        both = set(self.image_tasks + self.text_tasks) & set(self.heldout_image_tasks + self.heldout_text_tasks)
        if both:
            raise ValueError(f"task {sorted(both)[0]!r} is both a design task and a held-out task")
        for s in self.family_settings:
            check_choice("family setting", s, list(SETTINGS))
        for t in self.family_tasks:
            check_choice("family task", t, list(TASKS))
        if not self.calibrations:
            raise ValueError("calibrations is empty: give at least one of " + ", ".join(CALIBRATIONS))
        for c in self.calibrations:
            check_choice("calibration", c, CALIBRATIONS)
        from ftlab.experiments.transfer_accuracy.variants import variant_names

        for m in (*self.methods, *self.ablation_methods, *self.other_cal_methods, *self.heavy_methods,
                  *self.family_methods, *self.heldout_methods):
            check_choice("method", m, variant_names())
        from ftlab.experiments.transfer_accuracy.finetune import LOSS_KINDS

        check_choice("cal_loss", self.cal_loss, LOSS_KINDS)
        for k in ("n_train", "n_val", "n_test", "text_n_train", "text_n_val", "text_n_test", "family_n_train",
                  "family_n_val", "family_n_test", "cal_batch_size", "resolution", "text_max_length"):
            check_int(k, getattr(self, k), 1)
        for k in ("n_train", "text_n_train", "family_n_train"):
            if getattr(self, k) < 100 and "n100" in self.calibrations:
                raise ValueError(f"{k}={getattr(self, k)} is out of range: calibration n100 needs at least 100")
        if not self.alpha_grid or 1.0 not in self.alpha_grid or min(self.alpha_grid) < 0:
            raise ValueError(f"alpha_grid={self.alpha_grid!r} is invalid: it must contain 1.0 and no negative alpha")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def plan(self, task: str, pair: str = "") -> dict[str, tuple[str, ...]]:
        """``{calibration: methods}`` for one task (and pair); see the class docstring."""
        if task in self.heldout_image_tasks + self.heldout_text_tasks:
            return {self.calibrations[0]: tuple(self.heldout_methods)}
        if "mpnet" in pair:
            return {self.calibrations[0]: tuple(self.heavy_methods)}
        first = list(self.methods)
        if ((not self.ablation_tasks or task in self.ablation_tasks)
                and (not pair or not self.ablation_pairs or pair in self.ablation_pairs)):
            first += [m for m in self.ablation_methods if m not in first]
        out = {self.calibrations[0]: tuple(first)}
        for c in self.calibrations[1:] if (not pair or self.other_cal_real) else ():
            out[c] = tuple(self.other_cal_methods)
        return out

    def family_plan(self, task: str) -> dict[str, tuple[str, ...]]:
        """:meth:`plan` for the controlled family: ``family_methods`` added to the first calibration."""
        plan = self.plan(task)
        first = self.calibrations[0]
        plan[first] = tuple(dict.fromkeys((*plan[first], *self.family_methods)))
        return plan

    @classmethod
    def from_dict(cls, d: dict) -> BenchmarkConfig:
        d = dict(d)
        for k in ("vision_finetune", "text_finetune", "family_finetune"):
            if isinstance(d.get(k), dict):
                d[k] = TrainConfig(**{**d[k], "frozen": tuple(d[k].get("frozen", ("head",)))})
        for k, v in list(d.items()):
            if isinstance(v, list):
                d[k] = tuple(v)
        return cls(**d)

    def points(self, *, text_available: Sequence[str] | None = None) -> list[dict]:
        """The sweep points, seed by seed (so that a partial run holds balanced seeds; the first seeds serve as the
        internal pilot), the slowest first within a seed. A point's ``config`` leaves out the seed lists, so adding
        seeds to a configuration keeps the finished points of a resumed store."""
        cfg = {k: v for k, v in self.to_dict().items() if k not in _SEED_FIELDS}
        text_pairs = [p for p in self.text_pairs if text_available is None or p in text_available]
        heavy = [p for p in text_pairs if "mpnet" in p]
        light = [p for p in text_pairs if p not in heavy]
        heavy_seeds = self.text_seeds if self.heavy_seeds is None else self.heavy_seeds
        vision_pairs = list(self.vision_pairs) if self.split_vision_pairs else [""]
        text_tasks, image_tasks = self.text_tasks + self.heldout_text_tasks, self.image_tasks + self.heldout_image_tasks
        # the costliest pair (all-mpnet-base-v2) runs its design task only
        groups = [[("text", p, t, s) for p in heavy for t in self.text_tasks for s in heavy_seeds],
                  [("vision", p, t, s) for p in vision_pairs for t in image_tasks for s in self.seeds]
                  if self.vision_pairs else [],
                  [("text", p, t, s) for p in light for t in text_tasks for s in self.text_seeds],
                  [("family", "", t, s) for t in self.family_tasks for s in self.family_seeds]
                  if self.family_settings else []]
        order = sorted(((s, g, i) for g, pts in enumerate(groups) for i, (_, _, _, s) in enumerate(pts)))
        return [dict(zip(("kind", "pair", "task", "seed"), groups[g][i]), config=cfg) for _, g, i in order]


#: The design the pilot fixed (:mod:`~ftlab.experiments.transfer_accuracy.pilot`, docs/transfer-benchmark.md):
#: resolution, task, training-set size and fine-tuning recipe of each family of real pairs, chosen on validation data.
VISION_DESIGN: dict = dict(image_tasks=("mnist",), resolution=64, n_train=500, n_val=200, n_test=500,
                           vision_finetune=recipe(lr=0.03, epochs=5))
TEXT_DESIGN: dict = dict(text_tasks=("wordnet_nouns_all",), text_n_train=400, text_n_val=200, text_n_test=400,
                         text_max_length=24, text_finetune=recipe(lr=0.1, epochs=4))


#: The transfers compared on the design tasks of the real pairs and on the controlled ViTs (100 samples): the paper's
#: method and baselines, centred BiCo, ftlab's repair and copy rules, and ftlab's recommended transfer
#: (:mod:`~ftlab.experiments.transfer_accuracy.variants`).
DESIGN_METHODS: tuple[str, ...] = ("naive", "activation_only", "bico", "bico_centred", "naive+repair", "bico+repair",
                                   "bico_centred+repair", "recommended", "recommended/sum", "recommended/split",
                                   "recommended/first")
#: all-mpnet-base-v2, the costliest pair: the paper's method and baselines and the recommended transfer (both copy rules).
HEAVY_METHODS: tuple[str, ...] = ("naive", "activation_only", "bico", "bico+repair", "recommended", "recommended/sum")
#: Held-out tasks: the target's own accuracy, its fine-tuning, naive, plain BiCo and the recommended transfer.
HELD_OUT_METHODS: tuple[str, ...] = ("naive", "bico", "recommended")


def full_config() -> BenchmarkConfig:
    """The recorded run (``ftlab reproduce transfer --full``; needs ``make data-full`` for all-mpnet-base-v2): the three
    EfficientNet-Lite pairs and the two text pairs on the pilot's design (:data:`VISION_DESIGN`,
    :data:`TEXT_DESIGN`) and on held-out tasks that designed none of ftlab's defaults (Fashion-MNIST at 64 px,
    WordNet verb glosses over all 15 supersenses; all-mpnet-base-v2, the costliest pair, on its design task only), and
    the controlled ViTs of equal shape and the wider one.
    Methods (100 samples): :data:`DESIGN_METHODS` on the design tasks (:data:`HEAVY_METHODS` on all-mpnet-base-v2),
    :data:`HELD_OUT_METHODS` on the held-out tasks, the one-sided ablations on Lite1 -> Lite2, MiniLM-L3 -> L6 and the
    ViTs, TransFusion on the equal-shape ViTs, BiCo with 5 per class on the ViTs. Alpha: at 1 and searched on
    validation over :data:`ALPHA_GRID` (0 to 3). Seeds: 9, the fewest at which the exact sign-flip test can pass the
    first step of Holm's correction over the 11 primaries of the paper's claims (2^-8 < 0.05 / 11); 6 (the rule's
    minimum) for all-mpnet-base-v2, whose fine-tuning and evaluation cost most (100 validation and 300 test
    glosses)."""
    nine = tuple(range(9))
    return BenchmarkConfig(**VISION_DESIGN, **TEXT_DESIGN, seeds=nine, text_seeds=nine, heavy_seeds=tuple(range(6)),
                           heavy_n_val=100, heavy_n_test=300, heldout_image_tasks=("fashion",),
                           heldout_text_tasks=("wordnet_verbs_all",), heldout_methods=HELD_OUT_METHODS,
                           family_settings=("permuted", "continued_4ep", "independent", "pretraining", "width"),
                           family_tasks=("digits",), family_seeds=nine, methods=DESIGN_METHODS,
                           ablation_methods=("bico_input_only", "bico_output_only"), ablation_tasks=(),
                           ablation_pairs=("lite1->lite2", "minilm_l3->minilm_l6"), other_cal_methods=("bico",),
                           other_cal_real=False, heavy_methods=HEAVY_METHODS, calibrations=("n100", "k5"),
                           family_methods=("transfusion",))


def quick_config() -> BenchmarkConfig:
    """The default of ``ftlab reproduce transfer`` (under ten minutes on 2 cores): the width-only EfficientNet pair
    Lite1 -> Lite2 and the text pair MiniLM-L3 -> L6 on the full run's design with smaller evaluation sets, 2 seeds
    (too few for a verdict: the rule needs 6), naive / activation-only / BiCo / the recommended transfer with 100
    samples."""
    return BenchmarkConfig(**{**VISION_DESIGN, "n_test": 300, "n_val": 100}, **{**TEXT_DESIGN, "text_n_test": 300},
                           vision_pairs=("lite1->lite2",), seeds=(0, 1), text_pairs=("minilm_l3->minilm_l6",),
                           text_seeds=(0, 1), family_settings=(),
                           methods=("naive", "activation_only", "bico", "recommended"),
                           ablation_methods=(), calibrations=("n100",), family_methods=())


def tiny_config(**overrides) -> BenchmarkConfig:
    """A seconds-long configuration for tests (controlled family only, 1 task, 2 seeds)."""
    base: dict = dict(vision_pairs=(), text_pairs=(), family_settings=("permuted",), family_tasks=("digits",),
                      family_seeds=(0, 1), family_n_train=100, family_n_val=40, family_n_test=60,
                      family_finetune=recipe(lr=0.03, epochs=1), methods=("naive", "bico"), calibrations=("n100",),
                      alpha_grid=(0.5, 1.0), diagnose=False)
    return BenchmarkConfig(**{**base, **overrides})


def _scorer(splits: dict, classes=None):
    from ftlab.experiments.transfer_accuracy.compare import Scorer

    return Scorer(splits, classes)


def vision_point(task: str, seed: int, config: dict, pair: str = "") -> list[dict]:
    """Every EfficientNet pair for one (task, seed) (only ``pair`` if given): probes, fine-tunings (each model
    once), transfers. A model's probe and fine-tuning are drawn from (task, seed) alone, whichever pairs share it."""
    import torch

    from ftlab.experiments.transfer_accuracy.finetune import finetune, task_loss
    from ftlab.experiments.transfer_accuracy.pairs import PAIRS, load_encoder
    from ftlab.experiments.transfer_accuracy.probe import ProbeClassifier, fit_probe_head
    from ftlab.experiments.transfer_accuracy.vision import load_image_task

    torch.set_num_threads(1)
    cfg = BenchmarkConfig.from_dict(config)
    d = load_image_task(task, n_train=cfg.n_train, n_val=cfg.n_val, n_test=cfg.n_test, seed=seed,
                        resolution=cfg.resolution)
    splits = {"train": (d.x_train, d.y_train), "val": (d.x_val, d.y_val), "test": (d.x_test, d.y_test)}
    score = _scorer(splits)
    classes = range(d.n_classes)
    loss = task_loss(classes, cfg.cal_loss)
    models: dict = {}

    def model(key):
        if key not in models:
            enc = load_encoder(key)
            base = ProbeClassifier(enc, fit_probe_head(enc, d.x_train, d.y_train, n_classes=d.n_classes)).eval()
            models[key] = (base, finetune(base, d.x_train, d.y_train, classes, config=cfg.vision_finetune, seed=seed))
        return models[key]

    from ftlab.experiments.transfer_accuracy.compare import PairData, PairModels, evaluate_pair

    scores: dict = {}
    rows = []
    held = cfg.heldout_image_tasks
    for name in ([pair] if pair else cfg.vision_pairs):
        p = PAIRS[name]
        (a, a_ft), (b, b_ft) = model(p.source), model(p.target)
        if p.target not in scores:  # a target shared by two pairs is scored once
            scores[p.target] = (score(b, "test"), score(b_ft, "test"))
        rows += evaluate_pair(PairModels(setting_name(name, task, held), task, seed, a, a_ft, b, b_ft),
                              PairData(splits["train"], loss, score, {**cfg.transfer, **cfg.vision_transfer},
                                       scores[p.target]),
                              cfg.plan(task, name), alpha_grid=cfg.alpha_grid, cal_batch_size=cfg.cal_batch_size,
                              diagnose=cfg.diagnose)
    return rows


def text_point(pair: str, task: str, seed: int, config: dict) -> list[dict]:
    """One text pair on one (task, seed), read through linear-probe heads."""
    import torch

    from ftlab.experiments.transfer_accuracy.finetune import finetune, task_loss
    from ftlab.experiments.transfer_accuracy.pairs import PAIRS, load_encoder, text_tokenizer
    from ftlab.experiments.transfer_accuracy.probe import ProbeClassifier, fit_probe_head
    from ftlab.experiments.transfer_accuracy.text import load_text_task

    torch.set_num_threads(1)
    cfg = BenchmarkConfig.from_dict(config)
    p = PAIRS[pair]
    heavy = "mpnet" in pair
    d = load_text_task(task, text_tokenizer(), n_train=cfg.text_n_train,
                       n_val=cfg.heavy_n_val if heavy and cfg.heavy_n_val else cfg.text_n_val,
                       n_test=cfg.heavy_n_test if heavy and cfg.heavy_n_test else cfg.text_n_test,
                       max_length=cfg.text_max_length, seed=seed)
    splits = {"train": (d.x_train, d.y_train), "val": (d.x_val, d.y_val), "test": (d.x_test, d.y_test)}
    classes = range(d.n_classes)
    ft_cfg = dataclasses.replace(cfg.text_finetune, frozen=tuple(dict.fromkeys((*cfg.text_finetune.frozen, *TEXT_FROZEN))))
    tuned = []
    for key in (p.source, p.target):
        enc = load_encoder(key)
        base = ProbeClassifier(enc, fit_probe_head(enc, d.x_train, d.y_train, n_classes=d.n_classes)).eval()
        tuned.append((base, finetune(base, d.x_train, d.y_train, classes, config=ft_cfg, seed=seed)))
    (a, a_ft), (b, b_ft) = tuned
    from ftlab.experiments.transfer_accuracy.compare import PairData, PairModels, evaluate_pair

    opts = {"padding_mask": _attention_mask, **cfg.transfer, **cfg.text_transfer}
    return evaluate_pair(PairModels(setting_name(pair, task, cfg.heldout_text_tasks), task, seed, a, a_ft, b, b_ft),
                         PairData(splits["train"], task_loss(classes, cfg.cal_loss), _scorer(splits), opts),
                         cfg.plan(task, pair), alpha_grid=cfg.alpha_grid, cal_batch_size=cfg.cal_batch_size,
                         diagnose=cfg.diagnose)


@dataclass
class Prepared:
    """One (setting, task, seed) ready to transfer: bases, fine-tuned models, splits and how to score them."""

    setting: str
    task: str
    seed: int
    source_base: Any
    source_ft: Any
    target_base: Any
    target_ft: Any
    splits: dict
    classes: Any
    score: Callable
    baseline: str
    transfer_options: dict


def prepare(kind: str, setting: str, task: str, seed: int, config: dict, cache: str | None = None) -> Prepared:
    """Build one setting for :mod:`~ftlab.experiments.transfer_accuracy.investigate`: ``kind`` is ``vision`` or
    ``text`` (``setting`` a pair of :data:`~ftlab.experiments.transfer_accuracy.pairs.PAIRS`) or ``family``
    (``setting`` a key of :data:`~ftlab.experiments.transfer_accuracy.family.SETTINGS`)."""
    import torch

    from ftlab.experiments.transfer_accuracy.finetune import finetune
    from ftlab.experiments.transfer_accuracy.pairs import PAIRS, load_encoder, text_tokenizer
    from ftlab.experiments.transfer_accuracy.probe import ProbeClassifier, fit_probe_head

    check_choice("kind", kind, ("vision", "text", "family"))
    torch.set_num_threads(1)
    cfg = BenchmarkConfig.from_dict(config)
    if kind == "family":
        from ftlab.experiments.transfer_accuracy.family import SETTINGS, load_base
        from ftlab.experiments.transfer_accuracy.tasks import TASKS, load_task

        fd = load_task(task, n_train=cfg.family_n_train, n_val=cfg.family_n_val, n_test=cfg.family_n_test, seed=seed)
        t = torch.from_numpy
        splits = {"train": (t(fd.x_train), t(fd.y_train)), "val": (t(fd.x_val), t(fd.y_val)),
                  "test": (t(fd.x_test), t(fd.y_test))}
        classes = TASKS[task].joint_classes
        models = []
        for name in SETTINGS[setting]:
            b = load_base(name, cache=cache)[0]
            models.append((b, finetune(b, *splits["train"], classes, config=cfg.family_finetune, seed=seed)))
        return Prepared(setting, task, seed, *models[0], *models[1], splits, classes, _scorer(splits, classes),
                        "zero_shot", dict(cfg.transfer))
    p = PAIRS[setting]
    if kind == "vision":
        from ftlab.experiments.transfer_accuracy.vision import load_image_task

        d = load_image_task(task, n_train=cfg.n_train, n_val=cfg.n_val, n_test=cfg.n_test, seed=seed,
                            resolution=cfg.resolution)
        ft_cfg, opts = cfg.vision_finetune, {**cfg.transfer, **cfg.vision_transfer}
    else:
        from ftlab.experiments.transfer_accuracy.text import load_text_task

        d = load_text_task(task, text_tokenizer(), n_train=cfg.text_n_train, n_val=cfg.text_n_val,  # type: ignore[assignment]
                           n_test=cfg.text_n_test, max_length=cfg.text_max_length, seed=seed)
        ft_cfg = dataclasses.replace(cfg.text_finetune,
                                     frozen=tuple(dict.fromkeys((*cfg.text_finetune.frozen, *TEXT_FROZEN))))
        opts = {"padding_mask": _attention_mask, **cfg.transfer, **cfg.text_transfer}
    splits = {"train": (d.x_train, d.y_train), "val": (d.x_val, d.y_val), "test": (d.x_test, d.y_test)}
    task_classes = range(d.n_classes)
    models = []
    for key in (p.source, p.target):
        enc = load_encoder(key)
        base = ProbeClassifier(enc, fit_probe_head(enc, d.x_train, d.y_train, n_classes=d.n_classes)).eval()
        models.append((base, finetune(base, d.x_train, d.y_train, task_classes, config=ft_cfg, seed=seed)))
    return Prepared(setting, task, seed, *models[0], *models[1], splits, task_classes, _scorer(splits), "probe", opts)


def _attention_mask(batch):
    """The padding mask of a text calibration batch ``(inputs, labels)``."""
    return batch[0]["attention_mask"]


def family_point(task: str, seed: int, config: dict, cache: str | None = None) -> list[dict]:
    """Every controlled-family setting for one (task, seed), read zero-shot through the pretrained 20-class head."""
    import torch

    from ftlab.experiments.transfer_accuracy.family import SETTINGS, load_base
    from ftlab.experiments.transfer_accuracy.finetune import finetune, task_loss
    from ftlab.experiments.transfer_accuracy.tasks import TASKS, load_task

    torch.set_num_threads(1)
    cfg = BenchmarkConfig.from_dict(config)
    d = load_task(task, n_train=cfg.family_n_train, n_val=cfg.family_n_val, n_test=cfg.family_n_test, seed=seed)
    classes = TASKS[task].joint_classes
    t = torch.from_numpy
    splits = {"train": (t(d.x_train), t(d.y_train)), "val": (t(d.x_val), t(d.y_val)), "test": (t(d.x_test), t(d.y_test))}
    bases: dict = {}

    def base(name):
        if name not in bases:
            b = load_base(name, cache=cache)[0]
            bases[name] = (b, finetune(b, *splits["train"], classes, config=cfg.family_finetune, seed=seed))
        return bases[name]

    from ftlab.experiments.transfer_accuracy.compare import PairData, PairModels, evaluate_pair

    rows = []
    for setting in cfg.family_settings:
        src, tgt = SETTINGS[setting]
        (a, a_ft), (b, b_ft) = base(src), base(tgt)
        rows += evaluate_pair(PairModels(setting, task, seed, a, a_ft, b, b_ft, baseline="zero_shot"),
                              PairData(splits["train"], task_loss(classes, cfg.cal_loss), _scorer(splits, classes),
                                       dict(cfg.transfer)),
                              cfg.family_plan(task), alpha_grid=cfg.alpha_grid, cal_batch_size=cfg.cal_batch_size,
                              diagnose=cfg.diagnose)
    return rows


def benchmark_point(kind: str, pair: str, task: str, seed: int, config: dict, cache: str | None = None) -> list[dict]:
    """One sweep point (see the module docstring)."""
    check_choice("kind", kind, ("vision", "text", "family"))
    if kind == "vision":
        return vision_point(task, seed, config, pair)
    if kind == "text":
        return text_point(pair, task, seed, config)
    return family_point(task, seed, config, cache)


def pretrain_point(name: str, cache: str | None = None) -> dict:
    """Build (or read) one base of the controlled family; its metrics (a sweep point)."""
    import torch

    from ftlab.experiments.transfer_accuracy.family import load_base

    torch.set_num_threads(1)
    _, metrics = load_base(name, cache=cache)
    return {"base": name, **metrics}


def available_text_pairs(pairs: Sequence[str]) -> list[str]:
    """The text pairs whose weights are installed (all-mpnet-base-v2 is optional: ``make data-full``)."""
    from ftlab.data import DatasetMissing
    from ftlab.data.weights import mpnet_part_paths

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


def run_benchmark(config: BenchmarkConfig, *, store=None, cache=None, workers: int | None = None, scheduler=None):
    """Build (or read) the controlled bases, then run every point; return the tidy DataFrame of all records.

    store : JSON-lines file of finished points (a rerun resumes); cache : the base-model cache folder;
    workers / scheduler : see :func:`ftlab.core.sweep.run_sweep`. Text pairs whose weights are not installed
    are left out (``df.attrs["skipped_pairs"]``).
    """
    from ftlab.core.sweep import grid, run_sweep
    from ftlab.experiments.transfer_accuracy.family import FAMILY, SETTINGS

    cache = None if cache is None else str(cache)
    names = sorted({n for s in config.family_settings for n in SETTINGS[s]})
    names = sorted(set(names) | {FAMILY[n].parent for n in names if FAMILY[n].parent is not None})  # type: ignore[misc]
    pre = None
    if names:
        pre_store = None if store is None else str(store) + ".pretrain.jsonl"
        roots = [n for n in names if FAMILY[n].parent is None]
        pre = run_sweep(pretrain_point, grid(name=roots, cache=[cache]), store=pre_store, workers=workers,
                        scheduler=scheduler, desc="pretrain bases")
        derived = [n for n in names if FAMILY[n].parent is not None]
        if derived:
            more = run_sweep(pretrain_point, grid(name=derived, cache=[cache]), store=pre_store, workers=workers,
                             scheduler=scheduler, desc="derive bases")
            import pandas as pd

            pre = pd.concat([pre, more], ignore_index=True)
    text_ok = available_text_pairs(config.text_pairs)
    points = config.points(text_available=text_ok)
    for p in points:
        p["cache"] = cache
    df = run_sweep(benchmark_point, points, store=store, workers=workers, scheduler=scheduler, desc="transfer benchmark")
    df = df.drop(columns=[c for c in ("kind", "config", "cache", "pair") if c in df.columns])
    df.attrs["pretraining"] = [] if pre is None else pre.drop(columns=["cache"]).to_dict(orient="records")
    df.attrs["skipped_pairs"] = [p for p in config.text_pairs if p not in text_ok]
    return df
