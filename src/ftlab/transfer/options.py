"""The options of a transfer that do not belong to one method: :class:`TransferOptions`.

Everything that decides *which* statistics a calibration pass collects and *how rows are formed*
lives here (depth map, token alignment, padding, which parameters get a zero delta, precision,
diagnostics); a method's own settings live in its options dataclass (see
:mod:`ftlab.transfer.methods`). Both are frozen and validated, and both are written in full into
the run record (:meth:`TransferOptions.record`), so a record reproduces its run.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ftlab.core.validate import check_choice, check_int
from ftlab.transfer.align import SEQ_ALIGN, SeqAlign
from ftlab.transfer.layer_map import DEPTH_RULES, DepthRule
from ftlab.transfer.spec import DEFAULT_ZERO, NormGain, Rule

__all__ = ["BatchDtype", "TransferOptions"]

BatchDtype = Literal["float32", "float64"]
_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _callable_name(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


@dataclass(frozen=True)
class TransferOptions:
    """How a transfer pairs layers, forms calibration rows and records itself.

    depth_map : which source layer feeds each target layer of a stack (``stage_relative``, the
        default: within corresponding stages by relative depth; ``nearest_relative``, the paper's
        rule over the whole stack; ``proportional``; ``prefix``; ``cka``, from block-output
        similarity). See :mod:`ftlab.transfer.layer_map`.
    stages : ``{stack path: (source stage ids, target stage ids)}``, overriding the stages
        ``stage_relative`` finds from block output shapes.
    name_map : dotted name pieces of the target replaced by the source's (``{"attention.attn.q":
        "attention.self.query"}``) or a callable ``target name -> source name``, for architectures
        whose layers are named differently.
    vocab_map : for embedding tables whose vocabularies differ: ``(V_B,)`` integers giving the
        source row each target row continues (``-1``: none), applied to every embedding table with
        ``V_B`` rows, or ``{target parameter: index array}``. E.g. ``range(-4, V - 4)`` when
        B's token id = A's id + 4 (MPNet vs BERT).
    norm_gain : rule for norm gains, ``"vector"`` (``R_out^T tau``,
        as github.com/apanariello4/merge-and-rebase does) or ``"diagonal"``.
    seq_align : how token rows of A and B are paired (``identity``, ``interpolate``,
        ``interpolate2d``, ``mean``, ``cls``) [U].
    n_prefix : leading tokens (CLS, registers) matched one to one by ``interpolate2d``.
    padding_mask : ``"auto"`` (``batch["attention_mask"]`` when the batch is a mapping), a key of the
        batch, a callable ``batch -> (B, T) bool``, or None.
    seq_first : captured ``(T, B, d)`` tensors (``batch_first=False`` models).
    zero_params : parameter-name globs whose delta is zero (the target keeps its base value) [U].
    source_overrides, target_overrides : hand-written transport rules ``{param: [Rule, ...]}``.
    diagnostics : also stream ``A^T A`` and ``B^T B`` for CKA and alignment residuals per layer.
    batch_dtype : precision of each batch product: ``"float64"`` (default; rows cast to float64, so
        the sums are exact float64 sums of the rows) or ``"float32"`` (opt-in: float32 products
        staged in float32 buffers, flushed into the float64 sums every 8192 rows; faster on CPUs,
        and every rank is then judged at float32 precision). ``None`` means the default.
    cka_batches : calibration batches used by ``depth_map="cka"``.
    source_stats : statistics of A at its base (``"base"``, default [U]) or fine-tuned weights.
    train_mode : calibrate in train mode (default eval [U]).
    loss_reduction : ``"mean"`` (the loss averages over a batch's samples; captured gradients are
        multiplied by the batch's sample count, so every calibration sample weighs the same however
        the samples are batched) or ``"sum"`` (gradients used as they are).
    memory_limit : bytes the calibration statistics may take (default: the memory available);
        a transfer whose statistics would not fit is refused before they are allocated.
    """

    depth_map: DepthRule = "stage_relative"
    seq_align: SeqAlign = "identity"
    n_prefix: int | None = None
    padding_mask: str | Callable | None = "auto"
    seq_first: bool = False
    zero_params: tuple[str, ...] = DEFAULT_ZERO
    source_overrides: Mapping[str, Sequence[Rule]] | None = None
    target_overrides: Mapping[str, Sequence[Rule]] | None = None
    diagnostics: bool = False
    batch_dtype: BatchDtype | None = "float64"
    cka_batches: int = 4
    source_stats: Literal["base", "finetuned"] = "base"
    train_mode: bool = False
    loss_reduction: Literal["mean", "sum"] = "mean"
    stages: Mapping[str, tuple[Sequence[int], Sequence[int]]] | None = None
    name_map: Mapping[str, str] | Callable[[str], str] | None = None
    vocab_map: Sequence[int] | Mapping[str, Sequence[int]] | None = None
    norm_gain: NormGain = "vector"
    memory_limit: float | None = None

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
        if dt is None:
            dt = "float64"
        check_choice("batch_dtype", dt, tuple(_DTYPES))
        object.__setattr__(self, "batch_dtype", dt)
        check_int("cka_batches", self.cka_batches, minimum=1)
        check_choice("source_stats", self.source_stats, ("base", "finetuned"))
        check_choice("loss_reduction", self.loss_reduction, ("mean", "sum"))
        check_choice("norm_gain", self.norm_gain, ("vector", "diagonal"))
        if self.stages is not None:
            if not isinstance(self.stages, Mapping):
                raise ValueError(f"stages={self.stages!r} is invalid: give {{stack path: (source ids, target ids)}}")
            for path, v in self.stages.items():
                if not (isinstance(v, (tuple, list)) and len(v) == 2):
                    raise ValueError(f"stages[{path!r}] is invalid: give (source stage ids, target stage ids)")
        if self.name_map is not None and not (callable(self.name_map) or isinstance(self.name_map, Mapping)):
            raise ValueError(f"name_map={self.name_map!r} is invalid: give a mapping of name pieces or a callable")
        if self.vocab_map is not None:
            vm = self.vocab_map
            if isinstance(vm, Mapping):
                object.__setattr__(self, "vocab_map", {str(k): torch.as_tensor(v).long() for k, v in vm.items()})
            else:
                t = torch.as_tensor(list(vm) if not isinstance(vm, torch.Tensor) else vm)
                if t.ndim != 1 or t.is_floating_point():
                    raise ValueError("vocab_map must be a 1-D sequence of integers (target row -> source row, -1: none)")
                object.__setattr__(self, "vocab_map", t.long())
        if self.memory_limit is not None and not (isinstance(self.memory_limit, (int, float)) and self.memory_limit > 0):
            raise ValueError(f"memory_limit={self.memory_limit!r} is invalid: must be a positive number of bytes")
    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @property
    def torch_batch_dtype(self) -> torch.dtype | None:
        """``batch_dtype`` for :class:`~ftlab.core.stats.CrossMoments`: ``torch.float64``, or ``None`` (float32 staging)."""
        return torch.float64 if self.batch_dtype == "float64" else None

    def record(self) -> dict[str, Any]:
        """Every option as plain JSON (rules as dicts, callables by their qualified name)."""
        out: dict[str, Any] = {}
        for name in self.field_names():
            v = getattr(self, name)
            if name.endswith("_overrides") and v is not None:
                v = {k: [dataclasses.asdict(r) for r in rules] for k, rules in v.items()}
            elif name == "vocab_map" and v is not None:
                items = v.items() if isinstance(v, Mapping) else [("*", v)]
                v = {k: {"rows": int(t.numel()), "sha1": hashlib.sha1(t.numpy().tobytes()).hexdigest(),
                         "first": t[:8].tolist()} for k, t in items}
            elif name == "stages" and v is not None:
                v = {k: [list(a), list(b)] for k, (a, b) in v.items()}
            elif isinstance(v, Mapping):
                v = dict(v)
            elif callable(v):
                v = _callable_name(v)
            elif isinstance(v, tuple):
                v = list(v)
            out[name] = v
        return out
