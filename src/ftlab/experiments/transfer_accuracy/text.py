"""The text pair: all-MiniLM-L6-v2 (6 layers) -> paraphrase-MiniLM-L3-v2 (3 layers), a real depth change.

Task: WordNet noun gloss -> supersense (:func:`ftlab.data.text.load_wordnet_supersenses`),
restricted to the ``n_classes`` most frequent supersenses to stay CPU-cheap. Scoring is *linear
probing*, as BiCo scores T5 (spec/bico.md §5.3): a logistic regression is fitted on the frozen
mean-pooled sentence features of the training split and read on the test split.

Each encoder is wrapped in a :class:`TextClassifier`: ``encoder`` (the ``transformers.BertModel``)
followed by a frozen linear ``head`` -- the linear probe fitted on *that base's own* features.
The source is fine-tuned through its head (head frozen, encoder trained); the calibration loss of
each model is the cross-entropy through its own probe head, as each CLIP model uses its own text
head (spec §3.3). Tokenization is shared (same vocabulary), so tokens correspond one to one and
padding positions carry ``attention_mask = 0``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ftlab.core.validate import check_int

__all__ = ["TextTaskData", "TextClassifier", "load_text_task", "features", "fit_probe", "probe_accuracy"]


@dataclass(frozen=True)
class TextTaskData:
    """Tokenized splits (``probe``: fits each base's frozen head; ``train``: fine-tuning, calibration and
    the scoring probe; ``val``: alpha search; ``test``: scores): ``*_inputs`` are dicts of int64 tensors ``(n, max_length)``
    (``input_ids``, ``attention_mask``); labels are int64 tensors in ``0..n_classes-1``."""

    classes: tuple[str, ...]
    probe_inputs: dict
    y_probe: object
    train_inputs: dict
    y_train: object
    val_inputs: dict
    y_val: object
    test_inputs: dict
    y_test: object


def load_text_task(tokenizer, *, n_classes: int = 8, n_probe: int = 400, n_train: int = 400, n_val: int = 200,
                   n_test: int = 800, max_length: int = 32, seed: int = 0, wordnet_path=None) -> TextTaskData:
    """WordNet gloss -> supersense, the ``n_classes`` most frequent supersenses.

    Probe, validation and test glosses are fixed (independent of ``seed``); the training glosses are
    drawn by ``seed`` from the rest. ``tokenizer`` is a Hugging Face tokenizer (MiniLM's).
    """
    from ftlab.data.text import load_wordnet_supersenses

    for k, v in (("n_classes", n_classes), ("n_probe", n_probe), ("n_train", n_train), ("n_val", n_val), ("n_test", n_test),
                 ("max_length", max_length)):
        check_int(k, v, 1)
    wn = load_wordnet_supersenses(wordnet_path)
    counts = np.bincount(wn.labels, minlength=len(wn.classes))
    if n_classes > len(wn.classes):
        raise ValueError(f"n_classes={n_classes} is out of range: must be in [1, {len(wn.classes)}]")
    keep = np.sort(np.argsort(-counts, kind="stable")[:n_classes])
    idx = np.flatnonzero(np.isin(wn.labels, keep))
    local = np.searchsorted(keep, wn.labels[idx])
    order = np.random.default_rng(2024).permutation(len(idx))
    fixed = n_probe + n_val + n_test
    if fixed + n_train > len(order):
        raise ValueError(f"n_probe + n_train + n_val + n_test = {fixed + n_train} is out of range: "
                         f"only {len(order)} glosses")
    probe, val, test = order[:n_probe], order[n_probe:n_probe + n_val], order[n_probe + n_val:fixed]
    pool = order[fixed:]
    train = np.random.default_rng(seed).choice(pool, size=n_train, replace=False)

    def encode(sel):
        texts = [wn.glosses[i] for i in idx[sel]]
        enc = tokenizer(texts, padding="max_length", truncation=True, max_length=max_length, return_tensors="pt")
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}, torch.from_numpy(local[sel])

    pr, ypr = encode(probe)
    tr, ytr = encode(train)
    va, yva = encode(val)
    te, yte = encode(test)
    return TextTaskData(tuple(wn.classes[k] for k in keep), pr, ypr, tr, ytr, va, yva, te, yte)


def _mean_pool(hidden, mask):
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)


class TextClassifier(nn.Module):
    """``encoder`` (a ``BertModel``) -> masked mean pooling -> ``head`` (``nn.Linear``, frozen by the recipe).

    Input: a dict with ``input_ids`` and ``attention_mask`` ``(n, T)``; output logits ``(n, k)``.
    """

    def __init__(self, encoder: nn.Module, head: nn.Linear):
        super().__init__()
        self.encoder = encoder
        self.head = head

    def features(self, inputs: dict) -> torch.Tensor:
        out = self.encoder(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        return _mean_pool(out.last_hidden_state, inputs["attention_mask"])

    def forward(self, inputs: dict) -> torch.Tensor:
        return self.head(self.features(inputs))


def features(model, inputs, *, batch_size: int = 128) -> np.ndarray:
    """Mean-pooled encoder features ``(n, width)`` (float64) of a :class:`TextClassifier` or a ``BertModel``."""
    n = len(inputs["input_ids"])
    out = []
    enc = model.encoder if hasattr(model, "head") else model
    was = enc.training
    enc.eval()
    with torch.no_grad():
        for i in range(0, n, batch_size):
            sl = {k: v[i:i + batch_size] for k, v in inputs.items()}
            h = enc(input_ids=sl["input_ids"], attention_mask=sl["attention_mask"]).last_hidden_state
            out.append(_mean_pool(h, sl["attention_mask"]).double().numpy())
    enc.train(was)
    return np.concatenate(out)


def _logreg(feats: np.ndarray, labels: np.ndarray, c: float):
    from sklearn.linear_model import LogisticRegression

    mu = feats.mean(0)
    sd = float(np.sqrt(((feats - mu) ** 2).sum(1).mean())) + 1e-12  # one scale: features of unit mean norm
    clf = LogisticRegression(C=c, max_iter=2000)
    clf.fit((feats - mu) / sd, labels)
    return clf, mu, sd


def fit_probe(model, inputs, labels, *, c: float = 1.0):
    """Linear probe on ``model``'s frozen features: an ``nn.Linear(width, k)`` computing the logits of an
    L2-regularised logistic regression (``C = c``) fitted on centred features scaled to unit mean
    norm (one scalar for all features, so no near-constant feature gets a huge weight; the
    centring and scale are folded into the weights)."""

    clf, mu, sd = _logreg(features(model, inputs), np.asarray(labels), c)
    w = clf.coef_ / sd
    b = clf.intercept_ - w @ mu
    lin = nn.Linear(w.shape[1], w.shape[0])
    with torch.no_grad():
        lin.weight.copy_(torch.from_numpy(w))
        lin.bias.copy_(torch.from_numpy(b))
    return lin


def probe_accuracy(model, train_inputs, y_train, test_inputs, y_test, *, c: float = 1.0) -> float:
    """Linear-probe score: fit a logistic regression on ``model``'s train features, accuracy on the test features."""
    clf, mu, sd = _logreg(features(model, train_inputs), np.asarray(y_train), c)
    pred = clf.predict((features(model, test_inputs) - mu) / sd)
    return float((pred == np.asarray(y_test)).mean())
