"""Calibration batches as the transfer reads them: pairs ``(batch for A, batch for B)``.

A user gives either one iterable of batches, fed to both models, or two iterables
(``source_batches``, ``target_batches``) holding the same samples in the same order with each
model's own preprocessing. :class:`CalibrationData` pairs them, knows their count when the inputs
have a length, and lets a transfer read its first batches before the calibration pass (to probe
block shapes or layer similarity for the depth map) without reading them twice from the user's
iterable: the head is kept and replayed, so one-shot iterators (generators) work.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

__all__ = ["CalibrationData", "batch_slice", "default_forward", "padding_mask", "samples_in"]


class CalibrationData:
    """Paired calibration batches; iterate for ``(batch_A, batch_B)``.

    ``total`` is the number of pairs when known (inputs with a length), else None. :meth:`head`
    reads (and keeps) the first ``k`` pairs; the next iteration yields them again, then the rest.
    """

    def __init__(self, batches: Iterable | None = None, source_batches: Iterable | None = None,
                 target_batches: Iterable | None = None):
        if source_batches is None and target_batches is None:
            if batches is None:
                raise ValueError("batches is None: the method needs calibration batches")
            self._streams: tuple[Iterable, ...] = (batches,)
        else:
            sa = source_batches if source_batches is not None else batches
            sb = target_batches if target_batches is not None else batches
            if sa is None or sb is None:
                raise ValueError("give both source_batches and target_batches (or batches for the missing one)")
            if hasattr(sa, "__len__") and hasattr(sb, "__len__") and len(sa) != len(sb):  # type: ignore[arg-type]
                raise ValueError(f"source_batches has {len(sa)} batches but target_batches has {len(sb)}: "  # type: ignore[arg-type]
                                 "they must pair the same samples")
            self._streams = (sa, sb)
        lengths = [len(s) for s in self._streams if hasattr(s, "__len__")]  # type: ignore[arg-type]
        self.total: int | None = lengths[0] if len(lengths) == len(self._streams) else None
        self._it: Iterator | None = None
        self._head: list[tuple[Any, Any]] = []
        self._kept: list[Any] | None = None

    def keep_targets(self) -> list[Any]:
        """A list that the next iteration fills with the target's batches as they pass (for a second use of them,
        e.g. :mod:`ftlab.transfer.repair`); one-shot iterators are then read only once."""
        self._kept = []
        return self._kept

    def _pairs(self) -> Iterator[tuple[Any, Any]]:
        if len(self._streams) == 1:
            return ((b, b) for b in self._streams[0])
        return zip(self._streams[0], self._streams[1])

    def head(self, k: int) -> list[tuple[Any, Any]]:
        """The first ``k`` pairs (fewer if there are fewer); they are yielded again by the next iteration."""
        if self._it is None:
            self._it = self._pairs()
        while len(self._head) < k:
            nxt = next(self._it, None)
            if nxt is None:
                break
            self._head.append(nxt)
        return self._head[:k]

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        head, it = self._head, self._it if self._it is not None else self._pairs()
        self._head, self._it = [], None
        kept, self._kept = self._kept, None
        for pair in itertools.chain(head, it):
            if kept is not None:
                kept.append(pair[1])
            yield pair


def default_forward(model: nn.Module, batch) -> Any:
    """Run ``model`` on a batch without a loss.

    ``model(**batch)`` without its ``labels`` for a mapping, ``model(batch[0])`` for a tuple or list,
    ``model(batch)`` otherwise.
    """
    if isinstance(batch, Mapping):
        return model(**{k: v for k, v in batch.items() if k != "labels"})
    if isinstance(batch, (tuple, list)):
        return model(batch[0])
    return model(batch)


def samples_in(batch) -> int | None:
    """The number of samples in a batch: the leading size of its first tensor (None if it holds none)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.ndim else None
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, (tuple, list)):
        for v in batch:
            if isinstance(v, torch.Tensor) and v.ndim:
                return int(v.shape[0])
    return None


def batch_slice(batch, start: int, stop: int, n: int) -> Any:
    """Samples ``start:stop`` of a batch of ``n`` samples (:func:`samples_in`): every tensor whose first axis has
    length ``n`` sliced there (a view, no copy), mappings / tuples / lists entry by entry, anything else (0-d
    tensors, tensors of another leading size, non-tensors) as it is."""
    if isinstance(batch, torch.Tensor):
        return batch[start:stop] if batch.ndim and batch.shape[0] == n else batch
    if isinstance(batch, Mapping):
        return {k: batch_slice(v, start, stop, n) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        parts = [batch_slice(v, start, stop, n) for v in batch]
        return type(batch)(*parts) if hasattr(batch, "_fields") else type(batch)(parts)  # a named tuple too
    return batch


def padding_mask(batch, rule) -> torch.Tensor | None:
    """The ``(B, T)`` mask of real tokens of a batch under ``TransferOptions.padding_mask`` (None: no mask)."""
    if rule is None:
        return None
    if callable(rule):
        return rule(batch)
    if isinstance(batch, Mapping) and rule in batch:
        return batch[rule].bool()
    if rule == "auto" and isinstance(batch, Mapping) and "attention_mask" in batch:
        return batch["attention_mask"].bool()
    return None
