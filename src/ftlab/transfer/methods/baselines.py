"""Baselines that need no Procrustes maps: naive pad/truncate, identity, GradFix.

* ``naive``: the raw source task vector on the target; when shapes differ, each tensor is
  zero-padded or truncated to its leading block (``naive_mode="pad_truncate"``) or dropped
  (``naive_mode="zero"``). The paper's exact definition is unconfirmed [U].
* ``identity``: the raw task vector; every target parameter must have the source's shape.
* ``gradfix`` (Rinaldi et al., "GradFix", arXiv:2510.09658): gradients of the target
  loss at the target base decide a sign ``s`` per coordinate; ``vote="mean"`` uses
  ``sign(-sum of gradients)``, ``vote="max"`` the majority of per-*batch* signs (the original
  votes per image; here one vote per calibration batch [U]). ``mode="normal"`` keeps
  ``tau_A`` where ``sign(tau_A) == s``; ``mode="force"`` uses ``|tau_A| * s``. Same shapes only.

All of them follow the depth map (a target layer without a source layer gets zeros).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import torch

from ftlab.core.validate import check_choice
from ftlab.transfer.align import MapFit
from ftlab.transfer.calibrate import TargetGradients
from ftlab.transfer.methods.registry import Calibration, Requirements, Statistics, register
from ftlab.transfer.problem import TransferProblem
from ftlab.transfer.spec import Point
from ftlab.transfer.task_vector import TaskVector
from ftlab.transfer.transport import pad_truncate

__all__ = ["FittedCopy", "FittedGradFix", "GradFix", "GradFixOptions", "NaiveOptions", "NaiveTransfer"]


@dataclass(frozen=True)
class NaiveOptions:
    """Settings of the naive and identity baselines."""

    naive_mode: Literal["pad_truncate", "zero"] = field(
        default="pad_truncate", metadata={"help": "on a shape mismatch: pad_truncate (leading block) or zero"})
    strict_shapes: bool = field(default=False, metadata={"help": "a shape mismatch is an error (the identity method)"})

    def __post_init__(self) -> None:
        check_choice("naive_mode", self.naive_mode, ("pad_truncate", "zero"))


@dataclass(frozen=True)
class GradFixOptions:
    """Settings of GradFix."""

    vote: Literal["mean", "max"] = field(default="mean", metadata={
        "help": "sign of the summed gradient (mean) or majority of per-batch signs (max) [U]"})
    mode: Literal["normal", "force"] = field(default="normal", metadata={
        "help": "normal: keep agreeing coordinates; force: |tau_A| with the target's sign"})

    def __post_init__(self) -> None:
        check_choice("vote", self.vote, ("mean", "max"))
        check_choice("mode", self.mode, ("normal", "force"))


@dataclass(frozen=True)
class FittedCopy:
    """The source task vector copied onto the target's names (padded/truncated or zeroed on a shape mismatch)."""

    problem: TransferProblem
    options: NaiveOptions
    name: str
    fits: Mapping[str, tuple[MapFit | None, MapFit | None]] = field(default_factory=dict)

    def _source(self, tau_a: TaskVector, pname: str) -> torch.Tensor | None:
        src = self.problem.layer_map.source_name(pname)
        if src is None:
            return None
        if src not in tau_a:
            if any(fnmatch.fnmatchcase(pname, g) for g in self.problem.zero_params):
                return None  # named by zero_params and absent from the source: the target keeps its base value
            raise ValueError(f"target parameter {pname!r} needs source parameter {src!r}, "
                             "which the source task vector lacks")
        return tau_a[src]

    def _carry(self, pname: str, t: torch.Tensor | None, shape: tuple[int, ...]) -> torch.Tensor:
        if t is None:
            return torch.zeros(shape)
        if tuple(t.shape) == shape:
            return t.clone()
        if self.options.strict_shapes:
            raise ValueError(f"method {self.name!r} needs equal shapes, but {pname!r} is {shape} in the target and "
                             f"{tuple(t.shape)} in the source (use naive or bico)")
        if self.options.naive_mode == "zero":
            return torch.zeros(shape, dtype=t.dtype)
        return pad_truncate(t, shape)

    def apply(self, tau_a: TaskVector) -> TaskVector:
        return TaskVector({pname: self._carry(pname, self._source(tau_a, pname), tuple(shape))
                           for pname, shape in self.problem.target_shapes.items()})


class NaiveTransfer:
    """Copy the source task vector, padding/truncating (``pad_truncate``) or zeroing (``zero``) on shape mismatch.

    With ``strict_shapes=True`` (the ``identity`` method) a shape mismatch is an error.
    """

    calibration: Calibration = None
    needs_loss = False
    needs_second_moments = False

    def __init__(self, options: NaiveOptions | None = None, *, name: str = "naive"):
        self.options = options if options is not None else NaiveOptions()
        self.name = name

    def requirements(self, point: Point) -> Requirements:
        return {"in": (), "out": ()}

    def prepare(self, problem: TransferProblem, stats: Statistics = None) -> FittedCopy:
        return FittedCopy(problem, self.options, self.name)

    def check(self, tau_a: TaskVector, problem: TransferProblem) -> None:
        """Fail early (before any calibration) when shapes must match and do not."""
        if self.options.strict_shapes:
            self.prepare(problem).apply(tau_a)


@dataclass(frozen=True)
class FittedGradFix:
    """The copied task vector kept where its sign agrees with the target's descent sign (``normal``), or
    its magnitudes with that sign (``force``)."""

    copy: FittedCopy
    signs: Mapping[str, torch.Tensor]
    mode: str
    fits: Mapping[str, tuple[MapFit | None, MapFit | None]] = field(default_factory=dict)

    def apply(self, tau_a: TaskVector) -> TaskVector:
        out = {}
        for k, t in self.copy.apply(tau_a).items():
            s = self.signs.get(k)
            if s is None:
                out[k] = torch.zeros_like(t)  # no gradient information: GradFix keeps nothing
            elif self.mode == "normal":
                out[k] = t * (torch.sign(t) == s).to(t.dtype)
            else:
                out[k] = t.abs() * s.to(t.dtype)
        return TaskVector(out)


class GradFix:
    """Sign-mask the source task vector with the target's descent direction (same shapes)."""

    calibration: Calibration = "target_grads"
    needs_loss = True
    needs_second_moments = False

    def __init__(self, options: GradFixOptions | None = None, *, name: str = "gradfix"):
        self.options = options if options is not None else GradFixOptions()
        self.name = name
        self._copy = NaiveTransfer(NaiveOptions(strict_shapes=True), name=name)

    def requirements(self, point: Point) -> Requirements:
        return {"in": (), "out": ()}

    def check(self, tau_a: TaskVector, problem: TransferProblem) -> None:
        self._copy.check(tau_a, problem)

    def prepare(self, problem: TransferProblem, stats: Statistics = None) -> FittedGradFix:
        """``stats``: the target's calibration gradients (:class:`~ftlab.transfer.calibrate.TargetGradients`)."""
        if not isinstance(stats, TargetGradients):
            raise TypeError(f"gradfix needs the target's calibration gradients, got {type(stats).__name__}")
        if self.options.vote == "mean":
            signs = {k: torch.sign(-v).cpu() for k, v in stats.grad_sum.items()}
        else:
            signs = {k: torch.sign(v).cpu() for k, v in stats.sign_votes.items()}
        return FittedGradFix(self._copy.prepare(problem), signs, self.options.mode)


register("naive", human_name="Naive transfer (pad / truncate)",
         description="source task vector added as is; zero-padded or truncated where shapes differ",
         reference="baseline in Theseus (arXiv:2602.12952) and BiCo (arXiv:2605.28444); exact definition unconfirmed",
         needs="nothing", options=NaiveOptions)(NaiveTransfer)
register("identity", human_name="Identity (untransported task vector)",
         description="source task vector added unchanged; every shape must match",
         reference="Ilharco et al. Editing Models with Task Arithmetic. arXiv:2212.04089",
         needs="nothing (equal shapes)", options=NaiveOptions, preset={"strict_shapes": True})(NaiveTransfer)
register("gradfix", human_name="GradFix (gradient sign masking)",
         description="keep coordinates of tau_A whose sign agrees with the target's negative loss gradient",
         reference="Rinaldi et al. GradFix. arXiv:2510.09658", needs="calibration inputs, labels and a loss (equal shapes)",
         options=GradFixOptions)(GradFix)
