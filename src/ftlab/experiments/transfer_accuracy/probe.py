"""Linear-probe heads: the frozen read-out of every real pretrained model in the benchmark.

A pretrained encoder without a zero-shot head for a task (EfficientNet-Lite on digits, MiniLM or
MPNet on WordNet supersenses) is read through a *linear probe*: an L2-regularised logistic regression
fitted on the frozen base's pooled features of the task's training images, written into an
``nn.Linear`` and kept frozen while the encoder is fine-tuned -- as the BiCo paper evaluates T5 by
linear probing, and as Ilharco et al. fine-tune CLIP against a frozen text head. The target's linear
probe, its transferred versions and its direct fine-tuning are therefore read through the *same*
head, and the probe's own accuracy is the baseline a transfer must beat.

:class:`ProbeClassifier` wraps ``encoder`` (anything with ``features(inputs) -> (n, d)``) and
``head``. Its ``train()`` keeps every BatchNorm layer in eval mode: fine-tuning updates BatchNorm's
affine parameters but not its running statistics (frozen statistics, the usual choice when
fine-tuning a pretrained CNN on small batches; the task vector then holds parameters only).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from ftlab.core.modes import module_mode
from ftlab.core.validate import check_int, check_positive

__all__ = ["ProbeClassifier", "encode", "fit_logistic", "fit_probe_head"]


class ProbeClassifier(nn.Module):
    """``head(encoder.features(x))``; BatchNorm layers stay in eval mode under ``train()``."""

    def __init__(self, encoder: nn.Module, head: nn.Linear):
        super().__init__()
        self.encoder = encoder
        self.head = head

    def features(self, inputs) -> torch.Tensor:
        return self.encoder.features(inputs)  # type: ignore[operator]

    def forward(self, inputs) -> torch.Tensor:
        return self.head(self.features(inputs))

    def train(self, mode: bool = True) -> ProbeClassifier:
        super().train(mode)
        for m in self.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.eval()
        return self


@torch.no_grad()
def encode(features: Callable, inputs, *, batch_size: int = 128) -> np.ndarray:
    """``features(batch)`` over ``inputs`` (a tensor or a dict of row-aligned tensors) as float64 ``(n, d)``."""
    from ftlab.experiments.training import n_rows, take_rows

    check_int("batch_size", batch_size, minimum=1)
    n = n_rows(inputs)
    out = [features(take_rows(inputs, slice(i, i + batch_size))).double().numpy() for i in range(0, n, batch_size)]
    return np.concatenate(out)


def fit_logistic(feats: np.ndarray, labels: np.ndarray, *, c: float = 1.0, n_classes: int | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Weights ``(k, d)`` and bias ``(k,)`` of an L2-regularised multinomial logistic regression on ``feats``.

    Features are centred and scaled by one scalar (unit mean norm) before the fit, and the centring and
    scale are folded back into the weights, so the returned map applies to raw features. ``n_classes``
    (default: the number of distinct labels) fixes the output width; a class absent from ``labels``
    gets weight 0 and bias -30 (never predicted). Two classes give two rows (``[-w, w] / 2``).
    """
    from sklearn.linear_model import LogisticRegression

    check_positive("c", c)
    feats = np.asarray(feats, dtype=np.float64)
    labels = np.asarray(labels)
    k = int(n_classes) if n_classes is not None else int(labels.max()) + 1
    mu = feats.mean(0)
    scale = float(np.sqrt(((feats - mu) ** 2).sum(1).mean())) + 1e-12
    present = np.unique(labels)
    clf = LogisticRegression(C=c, max_iter=3000)
    clf.fit((feats - mu) / scale, labels)
    coef = clf.coef_
    icpt = clf.intercept_
    if len(present) == 2:  # sklearn returns one row for two classes: logits [-z/2, z/2] give the same posteriors
        coef = np.stack([-coef[0] / 2, coef[0] / 2])
        icpt = np.array([-icpt[0] / 2, icpt[0] / 2])
    W = np.zeros((k, feats.shape[1]))
    b = np.full(k, -30.0)
    W[present] = coef / scale
    b[present] = icpt - (coef / scale) @ mu
    return W, b


def fit_probe_head(encoder: nn.Module, inputs, labels, *, n_classes: int | None = None, c: float = 1.0,
                   batch_size: int = 128) -> nn.Linear:
    """The frozen linear-probe head of ``encoder`` (read in eval mode; every module's mode restored) fitted on
    ``(inputs, labels)``."""
    with module_mode(encoder):
        feats = encode(encoder.features, inputs, batch_size=batch_size)  # type: ignore[arg-type]
    W, b = fit_logistic(feats, np.asarray(labels), c=c, n_classes=n_classes)
    head = nn.Linear(W.shape[1], W.shape[0])
    with torch.no_grad():
        head.weight.copy_(torch.from_numpy(W))
        head.bias.copy_(torch.from_numpy(b))
    return head
