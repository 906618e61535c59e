"""The model ftlab writes for B as a PEFT LoRA adapter: ``B + alpha tau_B`` with everything that goes with it.

:func:`adapter_delta` gives the delta that turns base B into ``result.model(B, alpha)``
(:meth:`~ftlab.transfer.api.TransferResult.model`), and :func:`write_transfer_adapter` writes it with
:func:`~ftlab.transfer.lora.write_lora`, so that ``PeftModel.from_pretrained(B, folder)`` computes the same
function as ftlab's full output at the same alpha:

* **alpha** scales every transported delta: the LoRA factors hold ``alpha tau_B`` (each module's ``B`` factor
  carries the scale; ``lora_alpha`` stays the rank, scaling 1), and each ``modules_to_save`` entry holding a
  delta a LoRA cannot (a norm gain, say) is written as ``base + alpha delta``;
* the **statistics repair** (``TransferOptions.repair``): B's BatchNorm layers are written as
  ``modules_to_save`` entries with their re-pinned running statistics (PEFT restores a saved module's
  buffers); a target without running statistics needs none, and the report says which applied;
* **new heads** (:mod:`ftlab.transfer.heads`) are written whole as ``modules_to_save`` entries with the head
  ftlab fitted or carried, so the adapter does not depend on the head B's folder happens to hold.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from ftlab.transfer.task_vector import TaskVector

__all__ = ["adapter_delta", "write_transfer_adapter"]


def adapter_delta(result, target: nn.Module, alpha: float = 1.0) -> tuple[TaskVector, tuple[str, ...], dict]:
    """``(delta, saved, notes)``: the delta of ``result.model(target, alpha)`` from ``target``.

    ``delta`` holds ``alpha tau_B`` (float64, exactly: no difference of rounded weights), the re-pinned
    running statistics of repaired norm layers, and the new heads' values minus B's; ``saved`` names the
    modules an adapter must hold whole (the new heads); ``notes`` says what was applied (JSON-ready).
    """
    from ftlab.core.validate import check_finite
    from ftlab.transfer.heads import head_params

    check_finite("alpha", alpha)
    tau = result.task_vector
    delta = {k: alpha * v.double() for k, v in tau.items()}
    notes: dict = {"alpha": alpha, "heads": None, "repair": "none: the target has no norm layers with running "
                   "statistics, the repair is off, or alpha is 0"}
    base = {k: v.detach() for k, v in target.state_dict().items()}
    needs_model = (result.repair is not None and alpha != 0) or result.heads is not None
    if not needs_model:
        return TaskVector(delta), (), notes
    model = result.model(target, alpha)
    state = model.state_dict()
    if result.repair is not None and alpha != 0:
        for name, mod in model.named_modules():
            for b in ("running_mean", "running_var"):
                key = f"{name}.{b}" if name else b
                if key in delta and isinstance(getattr(mod, b, None), torch.Tensor):
                    delta[key] = state[key].double() - base[key].double()
        notes["repair"] = {"mode": result.repair.mode, "layers": sorted(result.repair.reference)}
    saved: tuple[str, ...] = ()
    if result.heads is not None:
        saved = tuple(result.heads.target)
        for key in head_params(target, saved):
            delta[key] = state[key].double() - base[key].double()
        notes["heads"] = result.heads.report()
    return TaskVector(delta), saved, notes


def write_transfer_adapter(folder: str | os.PathLike, result, target: nn.Module, *, alpha: float = 1.0,
                           max_rank: int | None = None, base_name: str | None = None) -> dict:
    """Write ``result`` at ``alpha`` into ``folder`` (which must exist) as a PEFT LoRA adapter for ``target``.

    ``PeftModel.from_pretrained(target, folder)`` then computes ``result.model(target, alpha)`` (see the module
    docstring). Returns :func:`~ftlab.transfer.lora.write_lora`'s report with ``alpha``, ``repair`` and
    ``heads`` added.
    """
    from ftlab.transfer.lora import write_lora

    delta, saved, notes = adapter_delta(result, target, alpha)
    report = write_lora(folder, delta, target, max_rank=max_rank, base_name=base_name, saved=saved)
    return {**report, **notes}
