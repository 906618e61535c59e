"""Model set-up, done in one place: a task's splits, each model's head and fine-tuning, and one pair ready to transfer.

For one (kind, task, seed) of a :class:`~ftlab.experiments.transfer_accuracy.design.BenchmarkConfig`,
:class:`TaskSetup` loads the task's training, validation and test splits and builds each model on demand, once:

* a real encoder (``kind`` ``vision`` or ``text``) gets a frozen linear-probe head fitted on its own features of the
  training draw (:mod:`~ftlab.experiments.transfer_accuracy.probe`), its *base*, and is fine-tuned through that head
  with the design's recipe (text: with :data:`TEXT_FROZEN` frozen too);
* a controlled ViT (``kind`` ``family``) keeps its pretrained 20-class head and reads the task's rows of it (its
  "zero-shot" head), and is fine-tuned through it.

:meth:`TaskSetup.pair` gives one pair (a real pair of :data:`~ftlab.experiments.transfer_accuracy.pairs.PAIRS` or a
controlled setting of :data:`~ftlab.experiments.transfer_accuracy.family.SETTINGS`) as the
:class:`~ftlab.experiments.transfer_accuracy.compare.PairModels` and
:class:`~ftlab.experiments.transfer_accuracy.compare.PairData` that
:func:`~ftlab.experiments.transfer_accuracy.compare.evaluate_pair` reads; a model shared by two pairs of one
(task, seed) is probed, fine-tuned and scored once. Every model is drawn from (task, seed) alone, whichever pairs
share it. The sweep points (:mod:`~ftlab.experiments.transfer_accuracy.run`), the investigation
(:mod:`~ftlab.experiments.transfer_accuracy.investigate`) and the pilot
(:mod:`~ftlab.experiments.transfer_accuracy.pilot`: :func:`real_task`, :func:`probed_and_tuned`) build their models
here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from ftlab.core.validate import check_choice
from ftlab.experiments.training import TrainConfig
from ftlab.experiments.transfer_accuracy import family
from ftlab.experiments.transfer_accuracy.claims import HELD_OUT
from ftlab.experiments.transfer_accuracy.compare import PairData, PairModels, Scorer
from ftlab.experiments.transfer_accuracy.design import BenchmarkConfig
from ftlab.experiments.transfer_accuracy.finetune import finetune, task_loss
from ftlab.experiments.transfer_accuracy.pairs import PAIRS, load_encoder, text_tokenizer
from ftlab.experiments.transfer_accuracy.probe import ProbeClassifier, fit_probe_head
from ftlab.experiments.transfer_accuracy.tasks import TASKS, load_task
from ftlab.experiments.transfer_accuracy.text import load_text_task
from ftlab.experiments.transfer_accuracy.vision import load_image_task

__all__ = ["KINDS", "TEXT_FROZEN", "TaskSetup", "attention_mask", "probed_and_tuned", "real_task", "setting_name",
           "text_recipe"]

#: The kinds of pairs: real EfficientNet-Lite pairs, real text pairs, the controlled ViT family.
KINDS: tuple[str, ...] = ("vision", "text", "family")
#: Text fine-tuning keeps the word-embedding table and MPNet's relative attention bias frozen (the source's converted
#: bias is zero and has no counterpart in a BERT source): their deltas are exactly zero.
TEXT_FROZEN: tuple[str, ...] = ("head", "encoder.model.embeddings.word_embeddings",
                                "encoder.model.encoder.relative_attention_bias")


def setting_name(pair: str, task: str, held_out: Sequence[str]) -> str:
    """The setting a pair's rows are recorded under: the pair, with :data:`HELD_OUT` on a held-out task."""
    return pair + HELD_OUT if task in held_out else pair


def text_recipe(config: TrainConfig) -> TrainConfig:
    """A text pair's fine-tuning recipe: ``config`` with :data:`TEXT_FROZEN` frozen too."""
    return dataclasses.replace(config, frozen=tuple(dict.fromkeys((*config.frozen, *TEXT_FROZEN))))


def attention_mask(batch) -> torch.Tensor:
    """The padding mask of a text calibration batch ``(inputs, labels)``."""
    return batch[0]["attention_mask"]


def real_task(kind: str, task: str, *, seed: int, n_train: int, n_val: int, n_test: int, size: int):
    """The data of a real pair's task: images at ``size`` px (``kind="vision"``) or glosses of ``size`` tokens
    (``"text"``, tokenized for every text encoder); ``n_*`` examples of each split."""
    check_choice("kind", kind, KINDS[:2])
    if kind == "vision":
        return load_image_task(task, n_train=n_train, n_val=n_val, n_test=n_test, seed=seed, resolution=size)
    return load_text_task(task, text_tokenizer(), n_train=n_train, n_val=n_val, n_test=n_test, max_length=size,
                          seed=seed)


def probed_and_tuned(encoder: str, data, config: TrainConfig, seed: int) -> tuple[Any, Any]:
    """``(base, fine-tuned)``: the pretrained ``encoder`` read through a linear probe fitted on ``data``'s training
    split, and that model fine-tuned through the frozen probe with ``config`` and ``seed``."""
    enc = load_encoder(encoder)
    base = ProbeClassifier(enc, fit_probe_head(enc, data.x_train, data.y_train, n_classes=data.n_classes)).eval()
    return base, finetune(base, data.x_train, data.y_train, range(data.n_classes), config=config, seed=seed)


class TaskSetup:
    """One (kind, task, seed) of a configuration ready for its pairs (see the module docstring).

    ``pair``: for ``kind="text"``, the pair whose evaluation sets are loaded (all-mpnet-base-v2's may be smaller);
    ``cache``: the controlled family's base-model cache folder. Sets ``torch.set_num_threads(1)``, so that the models
    and scores do not depend on the machine's thread count.
    """

    def __init__(self, kind: str, task: str, seed: int, cfg: BenchmarkConfig, *, pair: str = "",
                 cache: str | None = None):
        check_choice("kind", kind, KINDS)
        torch.set_num_threads(1)
        self.kind, self.task, self.seed, self.cfg, self.cache = kind, task, int(seed), cfg, cache
        self.options = cfg.settings.options(kind)
        self.held_out: Sequence[str] = ()  # the tasks whose rows carry HELD_OUT
        if kind == "family":
            fam = cfg.family
            d = load_task(task, n_train=fam.family_n_train, n_val=fam.family_n_val, n_test=fam.family_n_test, seed=seed)
            t = torch.from_numpy
            self.splits = {"train": (t(d.x_train), t(d.y_train)), "val": (t(d.x_val), t(d.y_val)),
                           "test": (t(d.x_test), t(d.y_test))}
            self.classes: Sequence[int] = TASKS[task].joint_classes
            self.score = Scorer(self.splits, self.classes)
            self.recipe, self.baseline = fam.family_finetune, "zero_shot"
        else:
            self.data = self._real_data(kind, task, seed, cfg, pair)
            d = self.data
            self.splits = {"train": (d.x_train, d.y_train), "val": (d.x_val, d.y_val), "test": (d.x_test, d.y_test)}
            self.classes = range(d.n_classes)
            self.score = Scorer(self.splits)
            self.baseline = "probe"
            if kind == "vision":
                self.recipe, self.held_out = cfg.vision.vision_finetune, cfg.vision.heldout_image_tasks
            else:
                self.recipe, self.held_out = text_recipe(cfg.text.text_finetune), cfg.text.heldout_text_tasks
                self.options = {"padding_mask": attention_mask, **self.options}
        self.loss = task_loss(self.classes, cfg.settings.cal_loss)
        self._models: dict[str, tuple[Any, Any]] = {}
        self._target_scores: dict[str, tuple[float, float]] = {}

    @staticmethod
    def _real_data(kind: str, task: str, seed: int, cfg: BenchmarkConfig, pair: str):
        if kind == "vision":
            v = cfg.vision
            return real_task(kind, task, seed=seed, n_train=v.n_train, n_val=v.n_val, n_test=v.n_test,
                             size=v.resolution)
        n_train, n_val, n_test = cfg.text.sizes(pair)
        return real_task(kind, task, seed=seed, n_train=n_train, n_val=n_val, n_test=n_test,
                         size=cfg.text.text_max_length)

    def members(self, setting: str) -> tuple[str, str]:
        """``(source, target)`` model names of a pair or controlled setting."""
        if self.kind == "family":
            return family.SETTINGS[setting]
        check_choice(f"{self.kind} pair", setting, [k for k, v in PAIRS.items() if v.kind == self.kind])
        return PAIRS[setting].source, PAIRS[setting].target

    def model(self, name: str) -> tuple[Any, Any]:
        """``(base, fine-tuned)`` of one encoder or controlled base, built on the first call."""
        if name not in self._models:
            if self.kind == "family":
                base = family.load_base(name, cache=self.cache)[0]
                x, y = self.splits["train"]
                self._models[name] = (base, finetune(base, x, y, self.classes, config=self.recipe, seed=self.seed))
            else:
                self._models[name] = probed_and_tuned(name, self.data, self.recipe, self.seed)
        return self._models[name]

    def pair(self, setting: str) -> tuple[PairModels, PairData]:
        """One pair ready for :func:`~ftlab.experiments.transfer_accuracy.compare.evaluate_pair` (the target's test
        accuracies, before and after its fine-tuning, scored once per target)."""
        source, target = self.members(setting)
        (a, a_ft), (b, b_ft) = self.model(source), self.model(target)
        if target not in self._target_scores:
            self._target_scores[target] = (self.score(b, "test"), self.score(b_ft, "test"))
        name = setting if self.kind == "family" else setting_name(setting, self.task, self.held_out)
        return (PairModels(name, self.task, self.seed, a, a_ft, b, b_ft, baseline=self.baseline),
                PairData(self.splits["train"], self.loss, self.score, dict(self.options), self._target_scores[target]))
