"""The benchmark's design: what a run measures, fixed before it runs and saved with its results.

A :class:`BenchmarkConfig` holds one object per part of the design that changes together:

* :class:`VisionDesign` -- the EfficientNet-Lite pairs: tasks, held-out tasks, resolution, seeds, split sizes and
  fine-tuning recipe;
* :class:`TextDesign` -- the text pairs: the same for glosses, plus the smaller evaluation sets and seeds of the
  costly all-mpnet-base-v2 pair;
* :class:`FamilyDesign` -- the controlled ViT settings;
* :class:`MethodPlan` -- which transfers run on which task, pair and calibration set;
* :class:`TransferSettings` -- how every transfer is calibrated and scored (calibration batches and loss, alpha
  grid, options passed to the transfer, the diagnostic).

The sweep store keeps a point's configuration as one *flat* dict (:meth:`BenchmarkConfig.to_dict`): the field
names of the five parts are distinct, and the flat dict is their union, key for key the dict of the single-level
configuration that recorded the earlier runs, so a store written then resumes and reads back
(:meth:`BenchmarkConfig.from_dict`). :func:`full_config` is the recorded run, :func:`quick_config` the default of
``ftlab reproduce transfer``, :func:`tiny_config` a seconds-long run for tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ftlab.core.validate import check_choice, check_int
from ftlab.experiments.training import TrainConfig
from ftlab.experiments.transfer_accuracy import family, pairs, tasks, text, vision
from ftlab.experiments.transfer_accuracy.compare import CALIBRATIONS
from ftlab.experiments.transfer_accuracy.finetune import LOSS_KINDS, recipe
from ftlab.experiments.transfer_accuracy.variants import variant_names

__all__ = ["ALPHA_GRID", "CALIBRATIONS", "DESIGN_METHODS", "HEAVY_METHODS", "HELD_OUT_METHODS", "TEXT_DESIGN",
           "VISION_DESIGN", "BenchmarkConfig", "FamilyDesign", "MethodPlan", "TextDesign", "TransferSettings",
           "VisionDesign", "full_config", "quick_config", "tiny_config"]

#: The alpha grid searched on validation for every method: 0 (the target untouched) to 3 in steps of 0.5.
ALPHA_GRID: tuple[float, ...] = tuple(0.5 * i for i in range(7))
#: The seed lists: a point's stored configuration leaves them out (adding seeds keeps a store's finished points).
SEED_FIELDS: tuple[str, ...] = ("seeds", "text_seeds", "heavy_seeds", "family_seeds")


def _check_pairs(what: str, names: Sequence[str], kind: str) -> None:
    for p in names:
        check_choice(what, p, [k for k, v in pairs.PAIRS.items() if v.kind == kind])


def _check_tasks(what: str, names: Sequence[str], known: Mapping) -> None:
    for t in names:
        check_choice(what, t, list(known))


def _check_held_out(design: Sequence[str], held_out: Sequence[str]) -> None:
    both = set(design) & set(held_out)
    if both:
        raise ValueError(f"task {sorted(both)[0]!r} is both a design task and a held-out task")


def _check_sizes(obj, names: Sequence[str]) -> None:
    for k in names:
        check_int(k, getattr(obj, k), 1)


class _Part:
    """A part of the design: its fields are keys of the flat dict (:meth:`BenchmarkConfig.to_dict`)."""

    TRAIN_FIELDS: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]

    @classmethod
    def from_flat(cls, d: Mapping[str, Any]):
        """This part from the keys of a flat dict it owns (JSON forms read back: lists as tuples, recipes as
        :class:`~ftlab.experiments.training.TrainConfig`); missing keys take their defaults."""
        kw = {}
        for k in cls.keys():
            if k not in d:
                continue
            v = d[k]
            if k in cls.TRAIN_FIELDS and isinstance(v, Mapping):
                v = TrainConfig(**{**v, "frozen": tuple(v.get("frozen", ("head",)))})
            kw[k] = tuple(v) if isinstance(v, list) else v
        return cls(**kw)

    def flat(self) -> dict:
        return dataclasses.asdict(self)  # type: ignore[call-overload]


@dataclass(frozen=True)
class VisionDesign(_Part):
    """The real vision pairs: ``vision_pairs`` (:data:`~ftlab.experiments.transfer_accuracy.pairs.PAIRS`) on
    ``image_tasks`` and on ``heldout_image_tasks`` (tasks that designed none of ftlab's defaults) at ``resolution``
    px with ``seeds``; ``n_train`` images (fine-tuning set = probe set = calibration pool), ``n_val`` (alpha
    search) and ``n_test``; the ``vision_finetune`` recipe. ``split_vision_pairs``: one sweep point per
    (pair, task, seed) instead of per (task, seed) (balances two workers better, fine-tunes a shared model twice)."""

    TRAIN_FIELDS: ClassVar[tuple[str, ...]] = ("vision_finetune",)

    vision_pairs: tuple[str, ...] = ("lite0->lite1", "lite1->lite2", "lite0->lite2")
    image_tasks: tuple[str, ...] = ("mnist", "fashion", "digits", "fashion_tops", "mnist_noise")
    heldout_image_tasks: tuple[str, ...] = ()
    resolution: int = 32
    seeds: tuple[int, ...] = (0, 1, 2)
    n_train: int = 500
    n_val: int = 200
    n_test: int = 1000
    vision_finetune: TrainConfig = recipe(lr=0.03, epochs=5)
    split_vision_pairs: bool = False

    def __post_init__(self):
        _check_pairs("vision pair", self.vision_pairs, "vision")
        _check_tasks("image task", (*self.image_tasks, *self.heldout_image_tasks), vision.IMAGE_TASKS)
        _check_held_out(self.image_tasks, self.heldout_image_tasks)
        _check_sizes(self, ("n_train", "n_val", "n_test", "resolution"))


@dataclass(frozen=True)
class TextDesign(_Part):
    """The real text pairs: ``text_pairs`` on ``text_tasks`` and ``heldout_text_tasks`` with ``text_seeds``;
    ``text_n_*`` glosses of ``text_max_length`` tokens; the ``text_finetune`` recipe. The all-mpnet-base-v2 pair
    (the costliest) runs ``heavy_seeds`` with ``heavy_n_val`` / ``heavy_n_test`` glosses (None: the text pairs')."""

    TRAIN_FIELDS: ClassVar[tuple[str, ...]] = ("text_finetune",)

    text_pairs: tuple[str, ...] = ("minilm_l3->minilm_l6", "minilm_l6->mpnet_base")
    text_tasks: tuple[str, ...] = ("wordnet_nouns", "wordnet_verbs")
    heldout_text_tasks: tuple[str, ...] = ()
    text_seeds: tuple[int, ...] = (0, 1, 2)
    text_n_train: int = 400
    text_n_val: int = 200
    text_n_test: int = 600
    text_max_length: int = 24
    text_finetune: TrainConfig = recipe(lr=0.01, epochs=4)
    heavy_seeds: tuple[int, ...] | None = None
    heavy_n_val: int | None = None
    heavy_n_test: int | None = None

    def __post_init__(self):
        _check_pairs("text pair", self.text_pairs, "text")
        _check_tasks("text task", (*self.text_tasks, *self.heldout_text_tasks), text.TEXT_TASKS)
        _check_held_out(self.text_tasks, self.heldout_text_tasks)
        _check_sizes(self, ("text_n_train", "text_n_val", "text_n_test", "text_max_length"))

    @staticmethod
    def is_heavy(pair: str) -> bool:
        """Whether ``pair`` is the all-mpnet-base-v2 pair (its own seeds, evaluation sets and methods)."""
        return "mpnet" in pair

    def sizes(self, pair: str) -> tuple[int, int, int]:
        """``(n_train, n_val, n_test)`` glosses of ``pair``."""
        heavy = self.is_heavy(pair)
        return (self.text_n_train, self.heavy_n_val if heavy and self.heavy_n_val else self.text_n_val,
                self.heavy_n_test if heavy and self.heavy_n_test else self.text_n_test)

    def seeds_of(self, pair: str) -> tuple[int, ...]:
        """The seeds ``pair`` runs."""
        if self.is_heavy(pair) and self.heavy_seeds is not None:
            return self.heavy_seeds
        return self.text_seeds


@dataclass(frozen=True)
class FamilyDesign(_Part):
    """The controlled ViT family: ``family_settings`` (:data:`~ftlab.experiments.transfer_accuracy.family.SETTINGS`)
    on ``family_tasks`` with ``family_seeds``, ``family_n_*`` images, the ``family_finetune`` recipe."""

    TRAIN_FIELDS: ClassVar[tuple[str, ...]] = ("family_finetune",)

    family_settings: tuple[str, ...] = ("permuted", "continued_1ep", "continued_4ep", "independent", "pretraining",
                                        "width", "depth")
    family_tasks: tuple[str, ...] = ("mnist_rot90", "fashion_invert", "digits", "fashion_tops_rot180")
    family_seeds: tuple[int, ...] = (0, 1, 2)
    family_n_train: int = 500
    family_n_val: int = 300
    family_n_test: int = 1000
    family_finetune: TrainConfig = recipe(lr=0.03, epochs=5)

    def __post_init__(self):
        _check_tasks("family setting", self.family_settings, family.SETTINGS)
        _check_tasks("family task", self.family_tasks, tasks.TASKS)
        _check_sizes(self, ("family_n_train", "family_n_val", "family_n_test"))


@dataclass(frozen=True)
class MethodPlan(_Part):
    """Which transfers run where (:meth:`for_task`). ``methods`` on every task with the first of
    ``calibrations`` (:data:`CALIBRATIONS`); ``ablation_methods`` with it too, on ``ablation_tasks`` only (empty:
    every task) and, for real pairs, ``ablation_pairs`` only (empty: every pair); ``other_cal_methods`` with the
    other calibration sets (on real pairs only if ``other_cal_real``); ``heavy_methods`` (first calibration only) on
    the all-mpnet-base-v2 pair; ``family_methods`` added for the controlled family (TransFusion: equal shapes only,
    skipped elsewhere); ``heldout_methods`` (first calibration) on held-out tasks. Every name is a registered method
    or a variant (:func:`~ftlab.experiments.transfer_accuracy.variants.variant_names`)."""

    methods: tuple[str, ...] = ("naive", "activation_only", "bico")
    ablation_methods: tuple[str, ...] = ("bico_input_only", "bico_output_only", "gradient_only", "gradfix")
    ablation_tasks: tuple[str, ...] = ("fashion_tops", "mnist", "wordnet_nouns", "wordnet_verbs", "digits",
                                       "fashion_tops_rot180", "mnist_rot90", "fashion_invert")
    ablation_pairs: tuple[str, ...] = ()
    other_cal_methods: tuple[str, ...] = ("bico", "activation_only")
    other_cal_real: bool = True
    heavy_methods: tuple[str, ...] = ("naive", "activation_only", "bico")
    family_methods: tuple[str, ...] = ("transfusion",)
    heldout_methods: tuple[str, ...] = ()
    calibrations: tuple[str, ...] = CALIBRATIONS

    def __post_init__(self):
        if not self.calibrations:
            raise ValueError("calibrations is empty: give at least one of " + ", ".join(CALIBRATIONS))
        for c in self.calibrations:
            check_choice("calibration", c, CALIBRATIONS)
        known = variant_names()
        for m in (*self.methods, *self.ablation_methods, *self.other_cal_methods, *self.heavy_methods,
                  *self.family_methods, *self.heldout_methods):
            check_choice("method", m, known)

    def for_task(self, task: str, pair: str = "", *, held_out: bool = False) -> dict[str, tuple[str, ...]]:
        """``{calibration: methods}`` for one task of a real pair (``pair``) or of the controlled family (``""``,
        without :attr:`family_methods`: see :meth:`BenchmarkConfig.family_plan`)."""
        first = self.calibrations[0]
        if held_out:
            return {first: tuple(self.heldout_methods)}
        if TextDesign.is_heavy(pair):
            return {first: tuple(self.heavy_methods)}
        names = list(self.methods)
        if ((not self.ablation_tasks or task in self.ablation_tasks)
                and (not pair or not self.ablation_pairs or pair in self.ablation_pairs)):
            names += [m for m in self.ablation_methods if m not in names]
        out = {first: tuple(names)}
        for c in self.calibrations[1:] if (not pair or self.other_cal_real) else ():
            out[c] = tuple(self.other_cal_methods)
        return out


@dataclass(frozen=True)
class TransferSettings(_Part):
    """How every transfer is calibrated and scored: ``cal_batch_size`` and ``cal_loss`` (the calibration loss,
    :data:`~ftlab.experiments.transfer_accuracy.finetune.LOSS_KINDS`); ``alpha_grid`` (searched on validation, the
    same for every method; it contains 1); ``transfer``: options passed to every transfer
    (:class:`~ftlab.transfer.TransferOptions` fields and method options), ``vision_transfer`` / ``text_transfer``:
    extra options for those pairs; ``diagnose``: record the diagnostic's estimate read off the fits."""

    cal_batch_size: int = 32
    cal_loss: str = "ce"
    alpha_grid: tuple[float, ...] = ALPHA_GRID
    transfer: dict = field(default_factory=dict)
    vision_transfer: dict = field(default_factory=dict)
    text_transfer: dict = field(default_factory=dict)
    diagnose: bool = True

    def __post_init__(self):
        check_choice("cal_loss", self.cal_loss, LOSS_KINDS)
        check_int("cal_batch_size", self.cal_batch_size, 1)
        if not self.alpha_grid or 1.0 not in self.alpha_grid or min(self.alpha_grid) < 0:
            raise ValueError(f"alpha_grid={self.alpha_grid!r} is invalid: it must contain 1.0 and no negative alpha")

    def options(self, kind: str) -> dict:
        """The options of every transfer of a ``kind`` (``vision``, ``text``, ``family``) pair."""
        extra = {"vision": self.vision_transfer, "text": self.text_transfer}.get(kind, {})
        return {**self.transfer, **extra}


_PARTS: dict[str, type[_Part]] = {"vision": VisionDesign, "text": TextDesign, "family": FamilyDesign,
                                  "plan": MethodPlan, "settings": TransferSettings}
#: flat key -> the part that holds it (the parts' field names are distinct)
_OWNER: dict[str, str] = {k: name for name, part in _PARTS.items() for k in part.keys()}


@dataclass(frozen=True)
class BenchmarkConfig:
    """Everything that defines a benchmark run (saved next to its results): the parts of the design (see the
    module docstring). Built from parts, or from flat keys with :meth:`from_dict`; a flat key also reads as an
    attribute (``cfg.resolution``)."""

    vision: VisionDesign = field(default_factory=VisionDesign)
    text: TextDesign = field(default_factory=TextDesign)
    family: FamilyDesign = field(default_factory=FamilyDesign)
    plan: MethodPlan = field(default_factory=MethodPlan)
    settings: TransferSettings = field(default_factory=TransferSettings)

    def __post_init__(self):
        if "n100" not in self.plan.calibrations:
            return
        for k, part in (("n_train", self.vision), ("text_n_train", self.text), ("family_n_train", self.family)):
            if getattr(part, k) < 100:
                raise ValueError(f"{k}={getattr(part, k)} is out of range: calibration n100 needs at least 100")

    def __getattr__(self, name: str) -> Any:
        """A flat key reads its part's field (``cfg.n_train`` is ``cfg.vision.n_train``), for readers of the flat
        form; called only for names that are not attributes of the configuration itself."""
        part = _OWNER.get(name)
        if part is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(getattr(self, part), name)

    def to_dict(self) -> dict:
        """The flat dict of every field of every part (the form a sweep store keeps)."""
        out: dict = {}
        for name in _PARTS:
            out.update(getattr(self, name).flat())
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BenchmarkConfig:
        """Read a flat dict (:meth:`to_dict`, or its JSON form); missing keys take their defaults, an unknown key
        raises ``ValueError`` naming it."""
        unknown = sorted(set(d) - set(_OWNER))
        if unknown:
            raise ValueError(f"unknown benchmark configuration key {unknown[0]!r}")
        return cls(**{name: part.from_flat(d) for name, part in _PARTS.items()})

    def replace(self, **flat) -> BenchmarkConfig:
        """A copy with flat keys (:meth:`to_dict`) replaced."""
        return BenchmarkConfig.from_dict({**self.to_dict(), **flat})

    def calibration_plan(self, task: str, pair: str = "") -> dict[str, tuple[str, ...]]:
        """``{calibration: methods}`` for one task of a real pair (:meth:`MethodPlan.for_task`)."""
        held_out = task in self.vision.heldout_image_tasks + self.text.heldout_text_tasks
        return self.plan.for_task(task, pair, held_out=held_out)

    def family_plan(self, task: str) -> dict[str, tuple[str, ...]]:
        """The plan of the controlled family: ``family_methods`` added to the first calibration."""
        plan = self.calibration_plan(task)
        first = self.plan.calibrations[0]
        plan[first] = tuple(dict.fromkeys((*plan[first], *self.plan.family_methods)))
        return plan

    def points(self, *, text_available: Sequence[str] | None = None) -> list[dict]:
        """The sweep points, seed by seed (so that a partial run holds balanced seeds; the first seeds serve as the
        internal pilot), the slowest first within a seed. A point's ``config`` leaves out the seed lists, so adding
        seeds to a configuration keeps the finished points of a resumed store."""
        cfg = {k: v for k, v in self.to_dict().items() if k not in SEED_FIELDS}
        vis, txt, fam = self.vision, self.text, self.family
        text_pairs = [p for p in txt.text_pairs if text_available is None or p in text_available]
        heavy = [p for p in text_pairs if txt.is_heavy(p)]
        light = [p for p in text_pairs if p not in heavy]
        vision_pairs = list(vis.vision_pairs) if vis.split_vision_pairs else [""]
        text_tasks, image_tasks = txt.text_tasks + txt.heldout_text_tasks, vis.image_tasks + vis.heldout_image_tasks
        # the costliest pair (all-mpnet-base-v2) runs its design task only
        groups = [[("text", p, t, s) for p in heavy for t in txt.text_tasks for s in txt.seeds_of(p)],
                  [("vision", p, t, s) for p in vision_pairs for t in image_tasks for s in vis.seeds]
                  if vis.vision_pairs else [],
                  [("text", p, t, s) for p in light for t in text_tasks for s in txt.text_seeds],
                  [("family", "", t, s) for t in fam.family_tasks for s in fam.family_seeds]
                  if fam.family_settings else []]
        order = sorted(((s, g, i) for g, pts in enumerate(groups) for i, (_, _, _, s) in enumerate(pts)))
        return [dict(zip(("kind", "pair", "task", "seed"), groups[g][i]), config=cfg) for _, g, i in order]


#: The design the pilot fixed (:mod:`~ftlab.experiments.transfer_accuracy.pilot`, docs/transfer-benchmark.md):
#: resolution, task, training-set size and fine-tuning recipe of each family of real pairs, chosen on validation data
#: (flat keys of :meth:`BenchmarkConfig.to_dict`).
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
    return BenchmarkConfig(
        vision=VisionDesign(**VISION_DESIGN, seeds=nine, heldout_image_tasks=("fashion",)),
        text=TextDesign(**TEXT_DESIGN, text_seeds=nine, heldout_text_tasks=("wordnet_verbs_all",),
                        heavy_seeds=tuple(range(6)), heavy_n_val=100, heavy_n_test=300),
        family=FamilyDesign(family_settings=("permuted", "continued_4ep", "independent", "pretraining", "width"),
                            family_tasks=("digits",), family_seeds=nine),
        plan=MethodPlan(methods=DESIGN_METHODS, ablation_methods=("bico_input_only", "bico_output_only"),
                        ablation_tasks=(), ablation_pairs=("lite1->lite2", "minilm_l3->minilm_l6"),
                        other_cal_methods=("bico",), other_cal_real=False, heavy_methods=HEAVY_METHODS,
                        family_methods=("transfusion",), heldout_methods=HELD_OUT_METHODS, calibrations=("n100", "k5")))


def quick_config() -> BenchmarkConfig:
    """The default of ``ftlab reproduce transfer`` (under ten minutes on 2 cores): the width-only EfficientNet pair
    Lite1 -> Lite2 and the text pair MiniLM-L3 -> L6 on the full run's design with smaller evaluation sets, 2 seeds
    (too few for a verdict: the rule needs 6), naive / activation-only / BiCo / the recommended transfer with 100
    samples."""
    return BenchmarkConfig(
        vision=VisionDesign(**{**VISION_DESIGN, "n_test": 300, "n_val": 100}, vision_pairs=("lite1->lite2",),
                            seeds=(0, 1)),
        text=TextDesign(**{**TEXT_DESIGN, "text_n_test": 300}, text_pairs=("minilm_l3->minilm_l6",), text_seeds=(0, 1)),
        family=FamilyDesign(family_settings=()),
        plan=MethodPlan(methods=("naive", "activation_only", "bico", "recommended"), ablation_methods=(),
                        calibrations=("n100",), family_methods=()))


def tiny_config(**overrides) -> BenchmarkConfig:
    """A seconds-long configuration for tests (controlled family only, 1 task, 2 seeds); ``overrides``: flat keys of
    :meth:`BenchmarkConfig.to_dict`."""
    base: dict = dict(vision_pairs=(), text_pairs=(), family_settings=("permuted",), family_tasks=("digits",),
                      family_seeds=(0, 1), family_n_train=100, family_n_val=40, family_n_test=60,
                      family_finetune=recipe(lr=0.03, epochs=1), methods=("naive", "bico"), calibrations=("n100",),
                      alpha_grid=(0.5, 1.0), diagnose=False)
    return BenchmarkConfig.from_dict({**base, **overrides})
