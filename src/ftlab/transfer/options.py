"""The options of a transfer that do not belong to one method: :class:`TransferOptions`.

Everything that decides *which* statistics a calibration pass collects and *how rows are formed*
lives here (depth map, token alignment, padding, which parameters get a zero delta, precision,
diagnostics); a method's own settings live in its options dataclass (see
:mod:`ftlab.transfer.methods`). Both are frozen and validated, and both are written in full into
the run record (:meth:`TransferOptions.record`), so a record reproduces its run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ftlab.core.validate import check_choice, check_int
from ftlab.transfer.align import SEQ_ALIGN, SeqAlign
from ftlab.transfer.layer_map import DEPTH_RULES, DepthRule
from ftlab.transfer.spec import DEFAULT_ZERO, Rule

__all__ = ["BatchDtype", "TransferOptions"]

BatchDtype = Literal["float32", "float64"]
_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _callable_name(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


@dataclass(frozen=True)
class TransferOptions:
    """How a transfer pairs layers, forms calibration rows and records itself.

    depth_map : which source layer feeds each target layer of a stack (``nearest_relative``, the
        default; ``proportional``; ``prefix``; ``cka``, from block-output similarity).
    seq_align : how token rows of A and B are paired (``identity``, ``interpolate``,
        ``interpolate2d``, ``mean``, ``cls``) [U].
    n_prefix : leading tokens (CLS, registers) matched one to one by ``interpolate2d``.
    padding_mask : ``"auto"`` (``batch["attention_mask"]`` when the batch is a mapping), a key of the
        batch, a callable ``batch -> (B, T) bool``, or None.
    seq_first : captured ``(T, B, d)`` tensors (``batch_first=False`` models).
    zero_params : parameter-name globs whose delta is zero (the target keeps its base value) [U].
    source_overrides, target_overrides : hand-written transport rules ``{param: [Rule, ...]}``.
    diagnostics : also stream ``A^T A`` and ``B^T B`` for CKA and alignment residuals per layer.
    batch_dtype : precision of each batch product (``None``: float64 data in float64, lower
        precision staged in float32; ``"float32"``; ``"float64"``). Sums are always float64.
    cka_batches : calibration batches used by ``depth_map="cka"``.
    source_stats : statistics of A at its base (``"base"``, default [U]) or fine-tuned weights.
    train_mode : calibrate in train mode (default eval [U]).
    loss_reduction : ``"mean"`` (the loss averages over a batch's samples; captured gradients are
        multiplied by the batch's sample count, so every calibration sample weighs the same however
        the samples are batched) or ``"sum"`` (gradients used as they are).
    """

    depth_map: DepthRule = "nearest_relative"
    seq_align: SeqAlign = "identity"
    n_prefix: int | None = None
    padding_mask: str | Callable | None = "auto"
    seq_first: bool = False
    zero_params: tuple[str, ...] = DEFAULT_ZERO
    source_overrides: Mapping[str, Sequence[Rule]] | None = None
    target_overrides: Mapping[str, Sequence[Rule]] | None = None
    diagnostics: bool = False
    batch_dtype: BatchDtype | None = None
    cka_batches: int = 4
    source_stats: Literal["base", "finetuned"] = "base"
    train_mode: bool = False
    loss_reduction: Literal["mean", "sum"] = "mean"

    def __post_init__(self) -> None:
        check_choice("depth_map", self.depth_map, DEPTH_RULES)
        check_choice("seq_align", self.seq_align, SEQ_ALIGN)
        if self.n_prefix is not None:
            check_int("n_prefix", self.n_prefix, minimum=0)
        if not (self.padding_mask is None or isinstance(self.padding_mask, str) or callable(self.padding_mask)):
            raise ValueError(f"padding_mask={self.padding_mask!r} is invalid: must be 'auto', a batch key, a callable "
                             "or None")
        if isinstance(self.zero_params, str):
            raise ValueError(f"zero_params={self.zero_params!r} is invalid: must be a list of glob patterns")
        object.__setattr__(self, "zero_params", tuple(self.zero_params))
        dt = self.batch_dtype
        if isinstance(dt, torch.dtype):  # accept torch.float32 / torch.float64 too
            dt = {v: k for k, v in _DTYPES.items()}.get(dt, str(dt))
        if dt is not None:
            check_choice("batch_dtype", dt, tuple(_DTYPES))
        object.__setattr__(self, "batch_dtype", dt)
        check_int("cka_batches", self.cka_batches, minimum=1)
        check_choice("source_stats", self.source_stats, ("base", "finetuned"))
        check_choice("loss_reduction", self.loss_reduction, ("mean", "sum"))

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @property
    def torch_batch_dtype(self) -> torch.dtype | None:
        """``batch_dtype`` as a torch dtype (or None)."""
        return None if self.batch_dtype is None else _DTYPES[self.batch_dtype]

    def record(self) -> dict[str, Any]:
        """Every option as plain JSON (rules as dicts, callables by their qualified name)."""
        out: dict[str, Any] = {}
        for name in self.field_names():
            v = getattr(self, name)
            if name.endswith("_overrides") and v is not None:
                v = {k: [dataclasses.asdict(r) for r in rules] for k, rules in v.items()}
            elif callable(v):
                v = _callable_name(v)
            elif isinstance(v, tuple):
                v = list(v)
            out[name] = v
        return out
