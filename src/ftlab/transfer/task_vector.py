"""Task vectors (Ilharco et al. 2023, "Editing models with task arithmetic", arXiv 2212.04089).

A task vector ``tau = theta_ft - theta_pre`` is a mapping from parameter names to tensors.
:class:`TaskVector` supports ``tv + tv``, ``tv - tv``, ``a * tv``, ``-tv``, norms, and applying
``theta = theta_pre + alpha * tau`` to a model: :meth:`TaskVector.apply` returns a modified
*copy*, :meth:`TaskVector.apply_` changes the model in place.

Strict by default: building from two models needs identical names and shapes; applying needs
every name present in the model with the same shape; adding two task vectors needs the same keys.
``lenient=True`` skips (and logs) mismatches instead; it must be asked for.
"""

from __future__ import annotations

import copy
import logging
import math
import os
from collections.abc import Iterator, Mapping

import torch
from torch import nn

from ftlab.core.validate import check_finite

__all__ = ["TaskVector"]

log = logging.getLogger(__name__)


def _float_entries(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor) and v.is_floating_point()}


class TaskVector(Mapping):
    """An immutable mapping ``name -> delta tensor`` (float32 or float64, CPU).

    Examples
    --------
    >>> tv = TaskVector.from_models(base, finetuned)          # doctest: +SKIP
    >>> model = tv.apply(other_base, alpha=0.8)                # a copy; other_base is untouched
    >>> (tv_a + tv_b).norm()
    """

    __slots__ = ("_deltas",)

    def __init__(self, deltas: Mapping[str, torch.Tensor]):
        self._deltas = {str(k): v.detach() for k, v in deltas.items()}
        for k, v in self._deltas.items():
            if not isinstance(v, torch.Tensor) or not v.is_floating_point():
                raise ValueError(f"task vector entry {k!r} is not a floating-point tensor")

    # Mapping protocol -------------------------------------------------------------------------
    def __getitem__(self, key: str) -> torch.Tensor:
        return self._deltas[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._deltas)

    def __len__(self) -> int:
        return len(self._deltas)

    def __repr__(self) -> str:
        return f"TaskVector({len(self)} tensors, {self.numel()} numbers, norm={self.norm():.4g})"

    # construction ----------------------------------------------------------------------------
    @classmethod
    def from_state_dicts(cls, pre: Mapping[str, torch.Tensor], ft: Mapping[str, torch.Tensor], *,
                         lenient: bool = False) -> TaskVector:
        """``ft - pre`` over floating-point entries; names and shapes must agree unless ``lenient``."""
        pre, ft = _float_entries(pre), _float_entries(ft)
        only_pre, only_ft = sorted(set(pre) - set(ft)), sorted(set(ft) - set(pre))
        if (only_pre or only_ft) and not lenient:
            raise ValueError(f"state dicts differ in keys: only in base {only_pre[:3]}, only in fine-tuned {only_ft[:3]}"
                             " (lenient=True keeps the common keys)")
        out = {}
        for k in pre:
            if k not in ft:
                continue
            if pre[k].shape != ft[k].shape:
                if not lenient:
                    raise ValueError(f"shape mismatch for {k!r}: base {tuple(pre[k].shape)} "
                                     f"vs fine-tuned {tuple(ft[k].shape)}")
                log.warning("task vector: skipping %s (shape %s vs %s)", k, tuple(pre[k].shape), tuple(ft[k].shape))
                continue
            out[k] = (ft[k].detach().cpu() - pre[k].detach().cpu())
        return cls(out)

    @classmethod
    def from_models(cls, base: nn.Module, finetuned: nn.Module, *, lenient: bool = False) -> TaskVector:
        """``finetuned - base`` over the floating-point entries of the two state dicts."""
        return cls.from_state_dicts(base.state_dict(), finetuned.state_dict(), lenient=lenient)

    @classmethod
    def from_safetensors(cls, pre: str | os.PathLike, ft: str | os.PathLike, *, lenient: bool = False) -> TaskVector:
        """``ft - pre`` read from two checkpoints (safetensors, weights-only torch files or HF folders)."""
        from ftlab.transfer.io import load_state_dict

        return cls.from_state_dicts(load_state_dict(pre), load_state_dict(ft), lenient=lenient)

    @classmethod
    def zeros_like(cls, model_or_state) -> TaskVector:
        """A zero task vector over the floating-point entries of a model or state dict."""
        state = model_or_state.state_dict() if isinstance(model_or_state, nn.Module) else model_or_state
        return cls({k: torch.zeros_like(v.detach().cpu()) for k, v in _float_entries(state).items()})

    # arithmetic --------------------------------------------------------------------------------
    def _check_same(self, other: TaskVector) -> None:
        if not isinstance(other, TaskVector):
            raise TypeError(f"cannot combine a TaskVector with {type(other).__name__}")
        if set(self) != set(other):
            diff = sorted(set(self) ^ set(other))
            raise ValueError(f"task vectors have different keys (e.g. {diff[:3]})")
        for k in self:
            if self[k].shape != other[k].shape:
                raise ValueError(f"shape mismatch for {k!r}: {tuple(self[k].shape)} vs {tuple(other[k].shape)}")

    def __add__(self, other: TaskVector) -> TaskVector:
        self._check_same(other)
        return TaskVector({k: self[k] + other[k] for k in self})

    def __sub__(self, other: TaskVector) -> TaskVector:
        self._check_same(other)
        return TaskVector({k: self[k] - other[k] for k in self})

    def __neg__(self) -> TaskVector:
        return TaskVector({k: -v for k, v in self.items()})

    def __mul__(self, a: float) -> TaskVector:
        if isinstance(a, TaskVector):
            raise TypeError("TaskVector * TaskVector is not defined; use a scalar")
        check_finite("scale", float(a))
        return TaskVector({k: float(a) * v for k, v in self.items()})

    __rmul__ = __mul__

    def norm(self) -> float:
        """Global Frobenius norm ``sqrt(sum_k ||tau_k||_F^2)``."""
        return math.sqrt(sum(float(v.double().pow(2).sum()) for v in self.values()))

    def norms(self) -> dict[str, float]:
        """Frobenius norm per entry."""
        return {k: float(v.double().norm()) for k, v in self.items()}

    def numel(self) -> int:
        return sum(v.numel() for v in self.values())

    def state_dict(self) -> dict[str, torch.Tensor]:
        """A plain dict copy (for saving)."""
        return dict(self._deltas)

    def save(self, path: str | os.PathLike) -> None:
        """Write the deltas as a safetensors file (atomically)."""
        from ftlab.transfer.io import save_state_dict

        save_state_dict(path, self._deltas, metadata={"format": "ftlab-task-vector"})

    # application -------------------------------------------------------------------------------
    def apply_(self, model: nn.Module, alpha: float = 1.0, *, lenient: bool = False) -> nn.Module:
        """Add ``alpha * tau`` to ``model``'s parameters and buffers **in place**; returns ``model``.

        Every key must name an entry of the model's state dict with the same shape, unless
        ``lenient`` (then mismatches are skipped and logged). Tied weights listed under several
        names get their delta once. Nothing is changed when a check fails.
        """
        check_finite("alpha", float(alpha))
        state = model.state_dict(keep_vars=True)
        plan: list = []
        owner: dict = {}
        for k, v in self.items():
            if k not in state or state[k].shape != v.shape:
                why = "missing" if k not in state else f"shape {tuple(state[k].shape)} != {tuple(v.shape)}"
                if not lenient:
                    raise ValueError(f"cannot apply task vector: model entry {k!r} is {why} (lenient=True skips it)")
                log.warning("apply_: skipping %s (%s)", k, why)
                continue
            first = owner.setdefault(id(state[k]), k)
            if first != k:  # a tied weight (same tensor under two names): add its delta once
                if not torch.equal(self[first], v):
                    raise ValueError(f"{k!r} and {first!r} are the same tied tensor but have different deltas")
                continue
            plan.append((state[k], v))
        for target, _ in plan:
            if target.is_floating_point() and abs(float(alpha)) > torch.finfo(target.dtype).max:
                raise ValueError(f"alpha={alpha!r} is out of range for {target.dtype} weights: |alpha| must be at most "
                                 f"{torch.finfo(target.dtype).max:g}")
        with torch.no_grad():
            for target, v in plan:
                target.add_(v.to(device=target.device, dtype=target.dtype), alpha=float(alpha))
        return model

    def apply(self, model: nn.Module, alpha: float = 1.0, *, lenient: bool = False) -> nn.Module:
        """A deep copy of ``model`` with ``alpha * tau`` added; ``model`` is not modified."""
        return self.apply_(copy.deepcopy(model), alpha, lenient=lenient)
