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

from dataclasses import dataclass, field
from typing import Literal

import torch

from ftlab.core.validate import check_choice
from ftlab.transfer.methods import Calibration, register
from ftlab.transfer.problem import TransferProblem
from ftlab.transfer.spec import Point
from ftlab.transfer.task_vector import TaskVector
from ftlab.transfer.transport import pad_truncate

__all__ = ["GradFix", "GradFixOptions", "NaiveOptions", "NaiveTransfer"]


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
        self.problem: TransferProblem | None = None

    def requirements(self, point: Point) -> dict[str, str | None]:
        return {"in": None, "out": None}

    def prepare(self, problem: TransferProblem, stats=None) -> NaiveTransfer:
        self.problem = problem
        return self

    def _source(self, tau_a: TaskVector, pname: str) -> torch.Tensor | None:
        assert self.problem is not None
        src = self.problem.layer_map.source_name(pname)
        if src is None:
            return None
        if src not in tau_a:
            raise ValueError(f"target parameter {pname!r} needs source parameter {src!r}, "
                             "which the source task vector lacks")
        return tau_a[src]

    def check(self, tau_a: TaskVector, problem: TransferProblem) -> None:
        """Fail early (before any calibration) when shapes must match and do not."""
        if self.options.strict_shapes:
            NaiveTransfer.prepare(self, problem)
            NaiveTransfer.apply(self, tau_a)

    def apply(self, tau_a: TaskVector) -> TaskVector:
        if self.problem is None:
            raise ValueError(f"{self.name}: call prepare() before apply()")
        out = {}
        for pname, target_shape in self.problem.target_shapes.items():
            t = self._source(tau_a, pname)
            shape = tuple(target_shape)
            if t is None:
                out[pname] = torch.zeros(shape)
            elif tuple(t.shape) == shape:
                out[pname] = t.clone()
            elif self.options.strict_shapes:
                raise ValueError(f"method {self.name!r} needs equal shapes, but {pname!r} is {shape} in the target and "
                                 f"{tuple(t.shape)} in the source (use naive or bico)")
            elif self.options.naive_mode == "zero":
                out[pname] = torch.zeros(shape, dtype=t.dtype)
            else:
                out[pname] = pad_truncate(t, shape)
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
        self.signs: dict[str, torch.Tensor] = {}

    def requirements(self, point: Point) -> dict[str, str | None]:
        return {"in": None, "out": None}

    def check(self, tau_a: TaskVector, problem: TransferProblem) -> None:
        self._copy.check(tau_a, problem)

    def prepare(self, problem: TransferProblem, stats=None) -> GradFix:
        """``stats = {"grad_sum": {name: sum of batch gradients}, "sign_votes": {name: sum of batch signs}}``."""
        if stats is None:
            raise ValueError("gradfix needs the target's calibration gradients")
        self._copy.prepare(problem)
        key = "grad_sum" if self.options.vote == "mean" else "sign_votes"
        self.signs = {k: (torch.sign(-v) if key == "grad_sum" else torch.sign(v)).cpu() for k, v in stats[key].items()}
        return self

    def apply(self, tau_a: TaskVector) -> TaskVector:
        raw = self._copy.apply(tau_a)
        out = {}
        for k, t in raw.items():
            s = self.signs.get(k)
            if s is None:
                out[k] = torch.zeros_like(t)  # no gradient information: GradFix keeps nothing
            elif self.options.mode == "normal":
                out[k] = t * (torch.sign(t) == s).to(t.dtype)
            else:
                out[k] = t.abs() * s.to(t.dtype)
        return TaskVector(out)


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
