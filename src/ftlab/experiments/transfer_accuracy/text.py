"""Text tasks and encoders for the real pretrained text pairs.

Tasks (:data:`TEXT_TASKS`; WordNet 3.0 from the Debian package ``wordnet-base``):

* ``wordnet_nouns`` -- noun gloss -> supersense (lexicographer file), the 8 most frequent of 26;
* ``wordnet_verbs`` -- verb gloss -> verb supersense, the 8 most frequent of 15;
* ``wordnet_nouns_all`` / ``wordnet_verbs_all`` -- the same over every supersense (26 noun, 15 verb classes).

Glosses are tokenized once with all-MiniLM-L6-v2's (BERT uncased WordPiece) tokenizer; an encoder
written as an ``MPNetModel`` (all-mpnet-base-v2, or MiniLM-L6 converted by
:func:`ftlab.data.text.mpnet_from_bert`) maps the ids itself (:func:`ftlab.data.text.bert_to_mpnet_ids`:
MPNet id = BERT id + 4), so one batch feeds every model of a pair and token rows correspond one to
one. :class:`TextEncoder` pools the last hidden states over the real tokens (mean pooling, as the
sentence-transformers models were trained); the read-out is a frozen linear probe
(:mod:`~ftlab.experiments.transfer_accuracy.probe`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ftlab.core.validate import check_choice, check_int

__all__ = ["TEXT_TASKS", "TextEncoder", "TextTask", "TextTaskData", "load_text_task", "mean_pool"]


@dataclass(frozen=True)
class TextTask:
    """WordNet glosses of part of speech ``pos`` labelled by supersense, the ``n_classes`` most frequent."""

    name: str
    pos: str
    n_classes: int
    description: str


TEXT_TASKS: dict[str, TextTask] = {t.name: t for t in (
    TextTask("wordnet_nouns", "noun", 8, "WordNet noun gloss → supersense (8 most frequent of 26)"),
    TextTask("wordnet_verbs", "verb", 8, "WordNet verb gloss → supersense (8 most frequent of 15)"),
    TextTask("wordnet_nouns_all", "noun", 26, "WordNet noun gloss → supersense (all 26)"),
    TextTask("wordnet_verbs_all", "verb", 15, "WordNet verb gloss → supersense (all 15)"),
)}


@dataclass(frozen=True)
class TextTaskData:
    """Tokenized splits: ``*_inputs`` dicts of int64 ``(n, max_length)`` tensors (``input_ids``,
    ``attention_mask``), labels int64 in ``0..n_classes-1``."""

    task: TextTask
    classes: tuple[str, ...]
    x_train: dict
    y_train: torch.Tensor
    x_val: dict
    y_val: torch.Tensor
    x_test: dict
    y_test: torch.Tensor

    @property
    def n_classes(self) -> int:
        return len(self.classes)


def load_text_task(name: str, tokenizer, *, n_train: int, n_val: int, n_test: int, max_length: int = 24,
                   seed: int = 0, wordnet_path=None) -> TextTaskData:
    """Splits of text task ``name``: validation and test glosses fixed, ``n_train`` training glosses drawn by ``seed``."""
    from ftlab.data.text import load_wordnet_supersenses

    check_choice("task", name, list(TEXT_TASKS))
    for k, v in (("n_train", n_train), ("n_val", n_val), ("n_test", n_test), ("max_length", max_length)):
        check_int(k, v, 1)
    task = TEXT_TASKS[name]
    wn = load_wordnet_supersenses(wordnet_path, pos=task.pos)
    if task.n_classes > len(wn.classes):
        raise ValueError(f"task {name!r} needs {task.n_classes} supersenses but the data hold {len(wn.classes)}")
    counts = np.bincount(wn.labels, minlength=len(wn.classes))
    keep = np.sort(np.argsort(-counts, kind="stable")[:task.n_classes])
    idx = np.flatnonzero(np.isin(wn.labels, keep))
    local = np.searchsorted(keep, wn.labels[idx])
    order = np.random.default_rng(2024).permutation(len(idx))
    fixed = n_val + n_test
    if fixed + n_train > len(order):
        raise ValueError(f"n_train + n_val + n_test = {fixed + n_train} is out of range: task {name!r} has "
                         f"{len(order)} glosses")
    val, test, pool = order[:n_val], order[n_val:fixed], order[fixed:]
    train = np.random.default_rng(seed).choice(pool, size=n_train, replace=False)

    def encode(sel):
        enc = tokenizer([wn.glosses[i] for i in idx[sel]], padding="max_length", truncation=True,
                        max_length=max_length, return_tensors="pt")
        return ({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]},
                torch.from_numpy(local[sel].astype(np.int64)))

    (xtr, ytr), (xva, yva), (xte, yte) = encode(train), encode(val), encode(test)
    return TextTaskData(task, tuple(wn.classes[k] for k in keep), xtr, ytr, xva, yva, xte, yte)


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``hidden`` ``(n, T, d)`` over the positions where ``mask`` ``(n, T)`` is 1."""
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)


class TextEncoder(nn.Module):
    """A Hugging Face encoder (``model``: ``BertModel`` or ``MPNetModel``) with masked mean pooling.

    ``mpnet_ids=True`` converts BERT token ids to MPNet ids in ``features`` (for ``MPNetModel`` s fed
    BERT-tokenized batches). Input: a dict with ``input_ids`` and ``attention_mask``.
    """

    def __init__(self, model: nn.Module, *, mpnet_ids: bool = False):
        super().__init__()
        self.model = model
        self.mpnet_ids = bool(mpnet_ids)

    def features(self, inputs: dict) -> torch.Tensor:
        ids = inputs["input_ids"]
        if self.mpnet_ids:
            from ftlab.data.text import bert_to_mpnet_ids

            ids = bert_to_mpnet_ids(ids)
        out = self.model(input_ids=ids, attention_mask=inputs["attention_mask"])
        return mean_pool(out.last_hidden_state, inputs["attention_mask"])

    def forward(self, inputs: dict) -> torch.Tensor:
        return self.features(inputs)
