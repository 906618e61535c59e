"""LoRA adapters in and out: the files practitioners share, read as task vectors and written for a new base.

**In** (:func:`read_lora`): a PEFT LoRA adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``,
or a weights-only ``adapter_model.bin``), read as plain JSON and tensors (no code from the folder runs).
The task vector of a LoRA module is its merged delta (float64, so that it keeps its rank),
``scaling * B @ A`` with ``scaling = lora_alpha / r`` (``lora_alpha / sqrt(r)`` with ``use_rslora``;
per-module ``rank_pattern``/``alpha_pattern``), in the
layout of the base weight: transposed for ``fan_in_fan_out`` layers (GPT-2's ``Conv1D``), ``(B A)^T``
for embeddings, reshaped to the kernel for convolutions; ``lora_bias`` adds ``scaling * b`` to the base
bias. ``modules_to_save`` (a retrained head, say) contribute ``saved - base``, and so do the base weights PEFT
saves with a targeted ``embed_tokens``/``lm_head`` (``<module>.base_layer.weight``, ``save_embedding_layers``;
zero when the adapter was made on this base). A weight tied to another module's (``tie_word_embeddings``: the
LM head shares the embedding table) is one tensor with two uses; a LoRA or saved copy of one module changes one
use only, which no delta of the shared tensor holds, so an adapter changing a tied weight is refused (read and
write). Other adapter types
(DoRA, IA³, prompt tuning, LoHa, ...) and LoRA features ftlab does not read (layer replication,
target parameters, trainable tokens, ...) are refused in one line naming them.

**Out** (:func:`write_lora`): a target task vector as a PEFT LoRA adapter for the target base,
loadable with ``PeftModel.from_pretrained(target, folder)``. A Procrustes transfer keeps a LoRA
update's rank (``R_out^T (B A) R_in = (R_out^T B)(A R_in)``), so each target weight's delta is
factored exactly at the rank it has (found by a randomised range finder checked to ``1e-9``
relative); ``max_rank`` truncates instead (the relative truncation error of each module is
reported). Deltas a LoRA cannot hold (norm gains, grouped convolutions, anything but the weights
and biases of linear, convolution and embedding layers) make their module a ``modules_to_save``
entry (saved whole). Every module gets ``lora_alpha = r`` (scaling 1), so ``B @ A`` is the delta.
Bias deltas of LoRA modules are ``lora_B`` biases (``lora_bias``) when every LoRA module has a bias, else
the trained biases of peft's ``bias="lora_only"`` (peft cannot merge a ``lora_B`` bias into a layer without one).

Public work on carrying LoRA adapters across bases (LoRASuite, arXiv 2505.13515; LoRA-X, arXiv
2501.16559) re-factors the transferred update by a truncated SVD at the source rank; ftlab keeps
the exact rank unless asked to truncate.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ftlab.transfer.kinds import LayerKind, kind_for_module
from ftlab.transfer.kinds.base import plain_lora_delta
from ftlab.transfer.task_vector import TaskVector

__all__ = ["LoraAdapter", "is_adapter_folder", "low_rank_factor", "read_lora", "write_lora"]

CONFIG = "adapter_config.json"
WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
_PREFIX = "base_model.model."
#: LoRA features that change what an adapter computes and that ftlab does not read: refused by name.
_UNSUPPORTED = {"use_dora": "DoRA (use_dora)", "layer_replication": "layer replication", "target_parameters":
                "target_parameters", "trainable_token_indices": "trainable token indices", "use_qalora": "QA-LoRA",
                "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)", "use_bdlora": "BD-LoRA"}


def is_adapter_folder(path: str | os.PathLike) -> bool:
    """True for a folder holding a PEFT ``adapter_config.json``."""
    p = Path(path)
    return p.is_dir() and (p / CONFIG).is_file()


@dataclass(frozen=True)
class LoraAdapter:
    """A LoRA adapter read against its base: the task vector and what produced it.

    ``task_vector`` is keyed by the base model's parameter names; ``ranks[module]`` and
    ``scalings[module]`` describe each LoRA module; ``saved`` names the ``modules_to_save``.
    """

    folder: Path
    config: Mapping
    task_vector: TaskVector
    ranks: Mapping[str, int] = field(default_factory=dict)
    scalings: Mapping[str, float] = field(default_factory=dict)
    saved: tuple[str, ...] = ()


def _read_config(folder: Path) -> dict:
    from ftlab.core.results import read_json_object

    path = folder / CONFIG
    cfg = read_json_object(path)
    kind = cfg.get("peft_type")
    if kind != "LORA":
        raise ValueError(f"{path}: peft_type={kind!r}: ftlab reads LoRA adapters only (peft_type 'LORA')")
    for key, what in _UNSUPPORTED.items():
        if cfg.get(key) not in (None, False, [], {}, 0):
            raise ValueError(f"{path}: {what} is not supported (only plain LoRA adapters are read)")
    for key in ("r", "lora_alpha"):
        v = cfg.get(key)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{path}: field {key!r} must be a positive number, got {v!r}")
    for key in ("rank_pattern", "alpha_pattern"):
        if not isinstance(cfg.get(key) or {}, dict):
            raise ValueError(f"{path}: field {key!r} must be a mapping")
    return cfg


def _pattern_value(pattern: Mapping, module: str, default: float) -> float:
    """PEFT's rule: the first key that matches the module name's end."""
    import re

    for key, v in pattern.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return float(v)
    return float(default)


def _weights(folder: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    from ftlab.transfer.io import load_state_dict

    for name in WEIGHTS:
        if (folder / name).is_file():
            return folder / name, load_state_dict(folder / name)
    raise FileNotFoundError(f"adapter folder {str(folder)!r} holds no {' or '.join(WEIGHTS)}")


def _group(state: Mapping[str, torch.Tensor], path: Path) -> tuple[dict[str, dict[str, torch.Tensor]], dict, dict]:
    """LoRA tensors per module (``A``, ``B``, ``b``, ``emb``), modules_to_save tensors by base name, and the base
    weights of targeted layers that PEFT saved with the adapter (``<module>.base_layer.<p>``) by base name."""
    lora: dict[str, dict[str, torch.Tensor]] = {}
    saved: dict[str, torch.Tensor] = {}
    copies: dict[str, torch.Tensor] = {}
    parts = {".lora_A.weight": "A", ".lora_B.weight": "B", ".lora_B.bias": "b", ".lora_embedding_A": "A",
             ".lora_embedding_B": "B"}
    for key, t in state.items():
        name = key[len(_PREFIX):] if key.startswith(_PREFIX) else key
        hit = next((suf for suf in parts if name.endswith(suf)), None)
        if hit is not None:
            lora.setdefault(name[: -len(hit)], {})[parts[hit]] = t
            if "embedding" in hit:
                lora[name[: -len(hit)]]["emb"] = t
        elif ".lora_" in name:
            raise ValueError(f"{path}: tensor {key!r} is not a LoRA tensor ftlab reads")
        elif ".base_layer." in name:
            copies[name.replace(".base_layer.", ".", 1)] = t
        else:
            saved[name] = t
    for mod, ts in lora.items():
        if "A" not in ts or "B" not in ts:
            raise ValueError(f"{path}: module {mod!r} has {'lora_B' if 'B' in ts else 'lora_A'} but not its pair")
    return lora, saved, copies


def _tied(model: nn.Module) -> dict[str, str]:
    """``{parameter name: another name of the same tensor}`` for the parameters two modules share (tied weights)."""
    names: dict[int, list[str]] = {}
    for k, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(k)
    return {k: next(o for o in ks if o != k) for ks in names.values() if len(ks) > 1 for k in ks}


def _refuse_tied(model: nn.Module, changed, where: str) -> None:
    """``ValueError`` when a name in ``changed`` is a weight tied to another module's (see the module docstring)."""
    tied = _tied(model)
    hit = next((k for k in changed if k in tied), None)
    if hit is not None:
        raise ValueError(f"{where} changes {hit!r}, which is tied to {tied[hit]!r} (one tensor, two uses: "
                         "tie_word_embeddings); a LoRA or saved copy of one module changes one use only, which ftlab "
                         "does not carry: leave the tied layers out of the adapter")


def _delta(mod: nn.Module, A: torch.Tensor, B: torch.Tensor, scaling: float, name: str, fan_in_fan_out: bool,
           path: Path) -> torch.Tensor:
    """The merged weight delta of one LoRA module, in the base weight's layout (its layer kind knows the layout)."""
    W = getattr(mod, "weight", None)
    if not isinstance(W, torch.Tensor):
        raise ValueError(f"{path}: module {name!r} of the base has no weight for a LoRA update")
    A, B = A.double(), B.double()
    kind = kind_for_module(mod)
    where = f"{path}: module {name!r}"
    d = kind.lora_delta(mod, A, B, fan_in_fan_out, where) if kind is not None else plain_lora_delta(A, B, fan_in_fan_out)
    if tuple(d.shape) != tuple(W.shape):
        raise ValueError(f"{path}: module {name!r}: the adapter's update has shape {tuple(d.shape)} but the base weight "
                         f"is {tuple(W.shape)} (an adapter made for another base?)")
    return scaling * d  # float64: a rank-r update stays rank r (float32 rounding would fill every direction)


def read_lora(folder: str | os.PathLike, base: nn.Module) -> LoraAdapter:
    """The task vector of the LoRA adapter in ``folder`` against ``base`` (see the module docstring).

    Raises ``ValueError`` naming the file and the field or module for an adapter ftlab does not read or one
    made for another base (a target module missing from ``base``, shapes that do not fit), and for one that changes
    a weight ``base`` ties to another module's.
    """
    folder = Path(folder)
    cfg = _read_config(folder)
    path, state = _weights(folder)
    lora, saved, copies = _group(state, path)
    mods = dict(base.named_modules())
    params = {k: p.detach() for k, p in base.state_dict().items()}
    out: dict[str, torch.Tensor] = {}
    ranks, scalings = {}, {}
    for name, ts in lora.items():
        if name not in mods:
            raise ValueError(f"{path}: the adapter targets module {name!r}, which the base model does not have "
                             "(an adapter made for another base?)")
        r = int(_pattern_value(cfg.get("rank_pattern") or {}, name, cfg["r"]))
        alpha = _pattern_value(cfg.get("alpha_pattern") or {}, name, cfg["lora_alpha"])
        scaling = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
        w = f"{name}.weight"
        out[w] = _delta(mods[name], ts["A"], ts["B"], scaling, name, bool(cfg.get("fan_in_fan_out")), path)
        if "b" in ts:
            if f"{name}.bias" not in params:
                raise ValueError(f"{path}: module {name!r} has a lora_B bias but the base module has no bias")
            out[f"{name}.bias"] = scaling * ts["b"].double()
        ranks[name], scalings[name] = r, scaling
    for what, tensors in (("modules_to_save", saved), ("a targeted layer's base weight", copies)):
        for key, t in tensors.items():
            if key not in params:
                raise ValueError(f"{path}: saved tensor {key!r} ({what}) is not in the base model")
            if tuple(t.shape) != tuple(params[key].shape):
                raise ValueError(f"{path}: saved tensor {key!r} has shape {tuple(t.shape)} but the base's is "
                                 f"{tuple(params[key].shape)}")
            if t.is_floating_point():  # a targeted layer's base weight adds to its LoRA delta
                d = t.double() - params[key].cpu().double()
                out[key] = out[key] + d if key in out else d
    _refuse_tied(base, [k for k, v in out.items() if torch.count_nonzero(v)], f"{path}: the adapter")
    full = {k: out.get(k, torch.zeros_like(v.cpu(), dtype=torch.float64)) for k, v in params.items()
            if v.is_floating_point()}
    mts = tuple(sorted({k.rpartition(".")[0] for k in saved}))
    return LoraAdapter(folder, cfg, TaskVector(full), ranks, scalings, mts)


# --- out ------------------------------------------------------------------------------------------------


def low_rank_factor(M: torch.Tensor, *, max_rank: int | None = None, rtol: float | None = None, seed: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """``(B, A, err)`` with ``B @ A`` the best approximation of ``M`` (``m x n``) at its numerical rank.

    The rank is the number of singular values above ``rtol`` times the largest (default ``1e-9`` for a
    float64 ``M``, ``1e-5`` for a lower precision: its rounding is not signal), capped at ``max_rank``;
    ``err`` is the relative Frobenius error ``||M - B A|| / ||M||`` (0 up to rounding when nothing is
    truncated). A randomised range finder with a doubling width, accepted once it captures ``M`` to
    ``rtol``, keeps the cost at ``O(m n k)`` for a rank-``k`` matrix.
    """
    if rtol is None:
        rtol = 1e-9 if M.dtype == torch.float64 else 1e-5
    M = M.double()
    m, n = M.shape
    norm = float(torch.linalg.norm(M))
    if norm == 0:
        return M.new_zeros(m, 0), M.new_zeros(0, n), 0.0
    g = torch.Generator(device="cpu").manual_seed(seed)
    k = min(m, n, 16)
    while True:
        omega = torch.randn(n, min(n, k + 8), generator=g, dtype=torch.float64).to(M.device)
        Q, _ = torch.linalg.qr(M @ omega)
        R = Q.T @ M
        if k >= min(m, n) or float(torch.linalg.norm(M - Q @ R)) <= rtol * norm:
            break
        k *= 2
    U, S, Vh = torch.linalg.svd(R, full_matrices=False)
    r = int((S > rtol * S[0]).sum())
    if max_rank is not None:
        r = min(r, max_rank)
    B, A = (Q @ U[:, :r]) * S[:r], Vh[:r]
    err = math.sqrt(max(float((S[r:] ** 2).sum()), 0.0)) / norm
    return B, A, err


def _lora_layout(mod: nn.Module | None, deltas: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, LayerKind] | None:
    """The matrix a LoRA factors for this module (``out x in``) and the module's kind; None if no LoRA can hold the
    deltas (only a weight and a bias of a layer whose kind takes a LoRA)."""
    if mod is None or set(deltas) - {"weight", "bias"} or "weight" not in deltas:
        return None
    kind = kind_for_module(mod)
    M = None if kind is None or kind.lora_name is None else kind.lora_matrix(mod, deltas["weight"])
    return None if M is None or kind is None else (M, kind)


def _placeholder(tau: TaskVector, mods: Mapping[str, nn.Module], saved: tuple[str, ...]):
    """``(name, matrix, kind)`` of the module to carry a zero LoRA when nothing else does: the first weight of
    ``tau`` (the target's order) on a linear layer, else on any layer a LoRA can hold, outside ``saved``."""
    found: list[tuple] = []
    for key, t in tau.items():
        name, _, attr = key.rpartition(".")
        if attr != "weight" or name in saved:
            continue
        layout = _lora_layout(mods.get(name), {"weight": t})
        if layout is not None:
            found.append((layout[1].lora_name != "linear", len(found), name, *layout))
    if not found:
        raise ValueError("nothing in the task vector can be written as a PEFT LoRA adapter (no layer a LoRA can hold); "
                         "use --out-format full")
    _, _, name, M, kind = min(found)
    return name, M, kind


def write_lora(folder: str | os.PathLike, tau: TaskVector, target: nn.Module, *, max_rank: int | None = None,
               rtol: float | None = None, base_name: str | None = None, saved: tuple[str, ...] = ()) -> dict:
    """Write ``tau`` (keyed by the target's names) into ``folder`` as a PEFT LoRA adapter for ``target``.

    ``saved``: modules written whole (``modules_to_save``, ``base + delta``) even where a LoRA could hold their
    delta, e.g. a new task head (:mod:`ftlab.transfer.heads`), whose values must not depend on the target's own.

    Returns the per-module report ``{"modules": {name: {"rank", "truncation_error"}}, "modules_to_save": [...]}``.
    ``folder`` must exist (the caller stages it); files are ``adapter_config.json`` and
    ``adapter_model.safetensors``. A nonzero delta on a weight ``target`` ties to another module's (an embedding
    table shared with the LM head) is refused: a LoRA on one of its modules would change one use only.
    """
    from ftlab.transfer.io import save_state_dict

    mods = dict(target.named_modules())
    base = target.state_dict()
    by_module: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in tau.items():
        mod, _, attr = key.rpartition(".")
        if torch.count_nonzero(t) or mod in saved:
            by_module.setdefault(mod, {})[attr] = t
    _refuse_tied(target, [k for k, t in tau.items() if torch.count_nonzero(t)], "the task vector")
    tensors: dict[str, torch.Tensor] = {}
    ranks: dict[str, int] = {}
    widths: dict[str, int] = {}  # output width of each LoRA module (rows of B)
    report: dict = {"modules": {}, "modules_to_save": []}
    fan_in = set()
    biases: dict[str, torch.Tensor] = {}  # bias deltas of LoRA modules
    for name, deltas in by_module.items():
        mod = mods.get(name)
        layout = None if name in saved else _lora_layout(mod, deltas)
        if layout is None:
            prefix = f"{name}." if name else ""
            report["modules_to_save"].append(name)
            for k, v in base.items():
                if k.startswith(prefix) and k[len(prefix):].count(".") == 0:
                    d = deltas.get(k[len(prefix):])
                    tensors[f"{_PREFIX}{k}"] = (v + d.to(v)) if d is not None else v.clone()
            continue
        M, kind = layout
        assert mod is not None
        B, A, err = low_rank_factor(M, max_rank=max_rank, rtol=rtol)
        if B.shape[1] == 0:
            continue
        fan_in.add(kind.fan_in_fan_out)
        ranks[name], widths[name] = int(B.shape[1]), int(B.shape[0])
        tensors.update(kind.lora_tensors(f"{_PREFIX}{name}", B.to(torch.float32), A.to(torch.float32), mod))
        if "bias" in deltas:
            biases[name] = deltas["bias"]
        report["modules"][name] = {"kind": kind.lora_name, "rank": ranks[name], "truncation_error": err}
    if not ranks:  # PEFT loads no adapter without a LoRA module (e.g. alpha = 0 with a new head): a zero one
        name, M, kind = _placeholder(tau, mods, saved)
        mod = mods[name]
        fan_in.add(kind.fan_in_fan_out)
        ranks[name], widths[name] = 1, int(M.shape[0])
        zero_b, zero_a = torch.zeros(M.shape[0], 1), torch.zeros(1, M.shape[1])
        tensors.update(kind.lora_tensors(f"{_PREFIX}{name}", zero_b, zero_a, mod))
        report["modules"][name] = {"kind": kind.lora_name, "rank": 0, "truncation_error": 0.0,
                                   "note": "zero placeholder: PEFT needs one LoRA module; the task vector has none"}
    if len(fan_in) > 1:
        raise ValueError("the target mixes Conv1D (fan-in/fan-out) and other layers; one adapter cannot hold both")
    bias_mode = _bias_tensors(tensors, biases, {n: mods[n] for n in ranks}, widths)
    lora_bias = bias_mode == "none" and bool(biases)
    r = max(ranks.values(), default=1)
    config = {"peft_type": "LORA", "task_type": None, "base_model_name_or_path": base_name, "r": r, "lora_alpha": r,
              "rank_pattern": {_exact(n): k for n, k in ranks.items() if k != r},
              "alpha_pattern": {_exact(n): k for n, k in ranks.items() if k != r},
              "target_modules": sorted(ranks), "modules_to_save": report["modules_to_save"] or None,
              "fan_in_fan_out": bool(fan_in == {True}), "lora_dropout": 0.0, "bias": bias_mode, "lora_bias": lora_bias,
              "use_rslora": False, "use_dora": False, "init_lora_weights": True, "inference_mode": True}
    from ftlab.core.results import atomic_write_text

    folder = Path(folder)
    save_state_dict(folder / WEIGHTS[0], tensors, metadata={"format": "pt"})
    atomic_write_text(folder / CONFIG, json.dumps(config, indent=2) + "\n")
    report["rank"] = r
    return report


def _bias_tensors(tensors: dict, biases: Mapping[str, torch.Tensor], modules: Mapping[str, nn.Module],
                  widths: Mapping[str, int]) -> str:
    """Add the LoRA modules' bias deltas to ``tensors``; returns the adapter's peft ``bias`` field.

    Where every LoRA module has a bias, they are ``lora_B`` biases (peft's ``lora_bias``; zero where a module's delta
    has none). peft cannot merge a ``lora_B`` bias into a layer without one (Llama's and Qwen2's ``o_proj`` and MLP
    next to Qwen2's biased q/k/v), so otherwise they are written as peft writes trained biases (``bias="lora_only"``):
    each biased LoRA module's ``base_layer.bias``, base plus delta, which peft loads into the base layer.
    """
    if not biases:
        return "none"
    if all(getattr(m, "bias", None) is not None for m in modules.values()):
        for name in modules:
            t = biases.get(name)
            tensors[f"{_PREFIX}{name}.lora_B.bias"] = torch.zeros(widths[name]) if t is None else t.to(torch.float32)
        return "none"
    for name, m in modules.items():
        if isinstance(b := getattr(m, "bias", None), torch.Tensor):
            d = biases.get(name)
            tensors[f"{_PREFIX}{name}.base_layer.bias"] = b.detach().clone() if d is None else b.detach() + d.to(b)
    return "lora_only"


def _exact(name: str) -> str:
    """A rank/alpha pattern key that matches exactly this module (PEFT matches keys as regexes at a name's end)."""
    import re

    return "^" + re.escape(name) if name else name
