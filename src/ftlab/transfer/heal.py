"""A short heal: a few steps of LoRA training of a written adapter on labelled data (ftlab's option).

A training-free transfer carries what the statistics of the calibration rows determine; a few steps of
ordinary LoRA training from the transferred adapter fix what they leave (the new head, directions the
rows do not see). :func:`heal_adapter` loads the adapter onto the target with PEFT (trainable), runs
``steps`` optimizer steps of the user's loss on the given batches (cycled in order) with the recipe given
(AdamW by default, a constant learning rate), and returns the trained ``PeftModel``; :func:`save_healed`
writes its adapter files (``adapter_config.json``, ``adapter_model.safetensors``) into a folder.

Choices here (ftlab's): the model trains in train mode (dropout on) except norm layers with running
statistics, which stay in eval mode (their stored statistics are not in the adapter, so they must not
move); torch's random state is seeded with ``seed`` inside and restored afterwards; a non-finite loss stops
with a ``ValueError`` naming the step. Needs ``peft`` (``pip install peft``).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

__all__ = ["HealRecipe", "fresh_lora", "heal_adapter", "save_healed"]


@dataclass(frozen=True)
class HealRecipe:
    """How to heal: ``steps`` optimizer steps (0 = none), ``lr``, ``weight_decay``, ``optimizer``
    (``"adamw"`` or ``"sgd"`` with momentum 0.9), ``clip`` (max global gradient norm, 0 = none), ``seed``,
    ``dropout``: train with the model's dropout active (True, as LoRA training usually runs) or off (False: every
    module in eval mode while it trains). Running normalisation statistics stay frozen either way."""

    steps: int
    lr: float = 1e-3
    weight_decay: float = 0.0
    optimizer: str = "adamw"
    clip: float = 1.0
    seed: int = 0
    dropout: bool = True

    def __post_init__(self) -> None:
        from ftlab.core.validate import check_bool, check_choice, check_int, check_nonnegative, check_positive

        check_int("steps", self.steps, 0)
        check_positive("lr", self.lr)
        check_nonnegative("weight_decay", self.weight_decay)
        check_choice("optimizer", self.optimizer, ("adamw", "sgd"))
        check_nonnegative("clip", self.clip)
        check_bool("dropout", self.dropout)


def _peft():
    try:
        import peft
    except ImportError as exc:  # pragma: no cover - peft is in the dev extras
        raise ValueError("healing an adapter needs the peft package: pip install peft") from exc
    return peft


def _train_mode(model: nn.Module, dropout: bool = True) -> None:
    """Training mode for a heal: running normalisation statistics frozen; dropout on, or (``dropout=False``) every
    module in eval mode."""
    from ftlab.transfer.repair import running_norms

    if not dropout:
        model.eval()
        return
    model.train()
    for mod in running_norms(model).values():
        mod.eval()


def heal_adapter(target: nn.Module, adapter: str | os.PathLike, batches: Sequence, loss: Callable,
                 recipe: HealRecipe, *, callback: Callable[[int, nn.Module], None] | None = None) -> nn.Module:
    """``steps`` steps of LoRA training of the adapter in folder ``adapter`` on ``target`` (not modified).

    ``batches`` are cycled in order; ``loss(model, batch)`` is the training loss (the model is the
    ``PeftModel``). ``callback(step, model)`` is called after steps ``0`` (before any) and every step done
    (``model`` in eval mode during the call). Returns the trained ``PeftModel`` in eval mode.
    """
    peft = _peft()
    if not batches:
        raise ValueError("heal_adapter needs at least one batch")
    if not (Path(adapter) / "adapter_model.safetensors").is_file():  # peft would unpickle an adapter_model.bin
        raise ValueError(f"heal_adapter: {str(adapter)!r} holds no adapter_model.safetensors (ftlab loads adapter "
                         "weights from safetensors only, never from pickles)")
    # PEFT reads adapter_config.json as data and, with adapter_model.safetensors present (checked above), no pickle;
    # it has no trust_remote_code switch because it runs no code from the folder.
    model = peft.PeftModel.from_pretrained(copy.deepcopy(target), str(adapter), is_trainable=True)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"the adapter in {str(adapter)!r} has no trainable tensors")
    if recipe.optimizer == "adamw":
        opt: torch.optim.Optimizer = torch.optim.AdamW(params, lr=recipe.lr, weight_decay=recipe.weight_decay)
    else:
        opt = torch.optim.SGD(params, lr=recipe.lr, momentum=0.9, weight_decay=recipe.weight_decay)
    if callback is not None:
        model.eval()
        callback(0, model)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(recipe.seed)
        for step in range(recipe.steps):
            _train_mode(model, recipe.dropout)
            value = loss(model, batches[step % len(batches)])
            if not torch.isfinite(value.detach()):
                raise ValueError(f"heal: the loss is not finite at step {step + 1} ({float(value.detach())}); lower the "
                                 "learning rate")
            opt.zero_grad(set_to_none=True)
            value.backward()
            if recipe.clip > 0:
                torch.nn.utils.clip_grad_norm_(params, recipe.clip)
            opt.step()
            if callback is not None:
                model.eval()
                callback(step + 1, model)
    return model.eval()


def save_healed(model: nn.Module, folder: str | os.PathLike) -> list[str]:
    """Write a healed ``PeftModel``'s adapter files into ``folder`` (replacing them); returns their names."""
    import shutil
    import tempfile

    folder = Path(folder)
    names = ["adapter_config.json", "adapter_model.safetensors"]
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        model.save_pretrained(tmp)  # type: ignore[operator]
        for name in names:
            shutil.move(str(Path(tmp) / name), str(folder / name))  # PEFT's model card (README.md) is not kept
    return names


def fresh_lora(target: nn.Module, folder: str | os.PathLike, *, r: int, target_modules: Sequence[str],
               modules_to_save: Sequence[str] = (), lora_alpha: float | None = None, seed: int = 0) -> None:
    """Write a freshly initialised PEFT LoRA adapter for ``target`` into ``folder`` (PEFT's own initialisation,
    drawn with ``seed``): the start of a LoRA trained on the target directly, to compare with a transferred one."""
    peft = _peft()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = peft.get_peft_model(copy.deepcopy(target), peft.LoraConfig(
            r=r, lora_alpha=lora_alpha if lora_alpha is not None else 2 * r, target_modules=list(target_modules),
            modules_to_save=list(modules_to_save) or None, lora_dropout=0.0))
    save_healed(model, folder)
