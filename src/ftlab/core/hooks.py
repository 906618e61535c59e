"""Capture module inputs, outputs and output-gradients with plain PyTorch hooks.

:func:`capture` is a context manager. Inside it, every selected *capture point* records, for
each call, its input activation and its output tensor; :meth:`Captured.backward` then asks
autograd for ``dL/d(output)`` (and optionally ``dL/d(input)``) of every recorded call in one
``torch.autograd.grad`` call -- no weight gradient is formed and no ``.grad`` is touched. All hooks
(and the temporary attention forward, below) are removed when the block exits, also on error.

Capture points are module names (``"encoder.layer.0.attention.self.query"``). An
:class:`torch.nn.MultiheadAttention` computes its projections functionally, so hooks on its
``out_proj`` would never fire; inside :func:`capture` such a module runs an equivalent
decomposed forward (softmax attention written out) exposing four points ``<name>.q``,
``<name>.k``, ``<name>.v`` and ``<name>.out_proj``. Its original forward is restored on exit.

Selection (``select``): ``None`` = every supported parameterized module (see
:data:`SUPPORTED`); a glob string (``"blocks.*.mlp.*"``); a list of exact names (each must
exist); or a predicate ``f(name, module) -> bool``.

Bare parameter projections: a model may project with a parameter that belongs to no layer,
``x @ P`` (OpenCLIP's ``visual.proj`` and ``text_projection``). ``params=["visual.proj"]`` records
every ``x @ P`` / ``torch.matmul(x, P)`` / ``torch.mm(x, P)`` with that parameter as the right
operand under the point name ``"visual.proj"`` (input ``x``, output ``x @ P``), through a
:class:`torch.overrides.TorchFunctionMode` that is active only inside the block.

Loud failures instead of silent ones: a recorded output modified in place afterwards (e.g. by
``ReLU(inplace=True)``) would yield the gradient *after* the nonlinearity, so
:meth:`Captured.backward` raises naming the point.
"""

from __future__ import annotations

import contextlib
import fnmatch
import math
import types
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ftlab.core.modes import module_mode

__all__ = ["SUPPORTED", "Captured", "activations", "capture", "capture_points", "hook_count", "is_norm", "mha_points",
           "param_uses"]

#: Parameterized module types captured by default (plus norm layers, see :func:`is_norm`, and HF ``Conv1D``).
SUPPORTED = (nn.Linear, nn.Conv2d, nn.Embedding, nn.MultiheadAttention)

_NORMS = (nn.LayerNorm, nn.RMSNorm, nn.BatchNorm1d, nn.BatchNorm2d, nn.GroupNorm)
_MHA_PARTS = ("q", "k", "v", "out_proj")


def is_norm(module: nn.Module) -> bool:
    """A normalisation layer whose own parameters are 1-D gains/biases over its channels.

    Recognises torch's norm layers and, by class name, Hugging Face ones (``T5LayerNorm``,
    ``LlamaRMSNorm``, ...).
    """
    if isinstance(module, _NORMS):
        return True
    name = type(module).__name__
    own = list(module.parameters(recurse=False))
    return bool(own) and name.endswith(("LayerNorm", "RMSNorm")) and all(p.ndim == 1 for p in own)


def is_hf_conv1d(module: nn.Module) -> bool:
    """The Hugging Face ``Conv1D`` (GPT-2): a linear layer whose weight is stored ``(in, out)``."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf") and getattr(module, "weight", None) is not None


def _supported(module: nn.Module) -> bool:
    return isinstance(module, SUPPORTED) or is_norm(module) or is_hf_conv1d(module)


def mha_points(name: str) -> list[str]:
    """The four capture points of a :class:`~torch.nn.MultiheadAttention` called ``name``."""
    return [f"{name}.{p}" for p in _MHA_PARTS]


def _select(model: nn.Module, select) -> dict[str, nn.Module]:
    mods = dict(model.named_modules())
    if select is None:
        chosen = {n: m for n, m in mods.items() if _supported(m)}
    elif isinstance(select, str):
        chosen = {n: m for n, m in mods.items() if fnmatch.fnmatchcase(n, select) and _supported(m)}
    elif callable(select):
        chosen = {n: m for n, m in mods.items() if select(n, m)}
    else:
        names = list(select)
        missing = [n for n in names if n not in mods]
        if missing:
            raise ValueError(f"select names {missing[:3]} are not modules of the model")
        chosen = {n: mods[n] for n in names}
    # modules inside a MultiheadAttention are served by its decomposed forward
    mha = [n for n, m in chosen.items() if isinstance(m, nn.MultiheadAttention)]
    return {n: m for n, m in chosen.items() if not any(n.startswith(h + ".") for h in mha)}


def capture_points(model: nn.Module, select=None) -> list[str]:
    """Names of the capture points :func:`capture` would record for ``select`` (MHA expanded)."""
    out = []
    for n, m in _select(model, select).items():
        out.extend(mha_points(n) if isinstance(m, nn.MultiheadAttention) else [n])
    return out


@dataclass
class Captured:
    """What a :func:`capture` block recorded, per point, one list entry per call.

    ``inputs[p]`` are the raw input tensors (still attached to the graph), ``outputs[p]`` the
    outputs; after :meth:`backward`, ``output_grads[p]`` (and ``input_grads[p]`` when asked; ``None``
    where the input did not require grad) are filled. ``meta[p]`` holds per-point facts such as
    ``batch_first`` of an attention module.
    """

    inputs: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    outputs: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    output_grads: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    input_grads: dict[str, list[torch.Tensor | None]] = field(default_factory=dict)
    modules: dict[str, nn.Module] = field(default_factory=dict)
    meta: dict[str, dict] = field(default_factory=dict)
    _versions: dict[str, list[int]] = field(default_factory=dict)
    record_inputs: bool = True
    record_outputs: bool = True

    def _record(self, point: str, inp, out) -> None:
        if self.record_inputs and isinstance(inp, torch.Tensor):
            self.inputs.setdefault(point, []).append(inp)
        if self.record_outputs and isinstance(out, torch.Tensor):
            self.outputs.setdefault(point, []).append(out)
            self._versions.setdefault(point, []).append(out._version)

    def tensors(self) -> Iterator[torch.Tensor]:
        """Every recorded tensor: inputs, outputs and their gradients (None entries left out)."""
        for held in (self.inputs, self.outputs, self.output_grads, self.input_grads):
            for tensors in held.values():
                yield from (t for t in tensors if isinstance(t, torch.Tensor))

    def clear(self) -> None:
        """Forget the recorded tensors (call between batches)."""
        for d in (self.inputs, self.outputs, self.output_grads, self.input_grads, self._versions):
            d.clear()

    def backward(self, loss: torch.Tensor, *, input_grads: bool = False) -> None:
        """Fill ``output_grads`` (and ``input_grads``) with ``d loss / d tensor`` for every recorded call.

        Outputs that the loss does not depend on get zero gradients. Raises ``ValueError`` if the
        loss is not a finite scalar, or if a recorded output was modified in place after it was
        recorded.
        """
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ValueError("loss(model, batch) must return a scalar tensor")
        if not torch.isfinite(loss.detach()).all():
            raise ValueError(f"loss is not finite ({float(loss.detach())})")
        targets, keys = [], []
        for p, outs in self.outputs.items():
            for i, t in enumerate(outs):
                if t._version != self._versions[p][i]:
                    raise ValueError(
                        f"the output of capture point {p!r} was modified in place after the module ran "
                        "(e.g. ReLU(inplace=True)); its gradient would be taken after the nonlinearity")
                if t.requires_grad:
                    targets.append(t)
                    keys.append(("out", p, i))
        if input_grads:
            for p, ins in self.inputs.items():
                for i, t in enumerate(ins):
                    if t.requires_grad and t.is_floating_point():
                        targets.append(t)
                        keys.append(("in", p, i))
        if not loss.requires_grad:
            raise ValueError("the loss does not require grad: no captured tensor influences it")
        grads = torch.autograd.grad(loss, targets, allow_unused=True) if targets else []
        found: dict[tuple[str, str, int], torch.Tensor | None] = dict(zip(keys, grads))
        # outputs the loss does not depend on get a zero gradient; inputs without one get None
        self.output_grads = {p: [g if (g := found.get(("out", p, i))) is not None else torch.zeros_like(t)
                                 for i, t in enumerate(outs)] for p, outs in self.outputs.items()}
        self.input_grads = ({p: [found.get(("in", p, i)) for i in range(len(ins))] for p, ins in self.inputs.items()}
                            if input_grads else {})


def _mha_projections(mha: nn.MultiheadAttention, query, key, value):
    """``q, k, v`` of ``(B, T, E)`` inputs: the module's in-projections, fused or separate."""
    if mha._qkv_same_embed_dim:
        wq, wk, wv = mha.in_proj_weight.chunk(3)
    else:
        wq, wk, wv = mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight
    bq, bk, bv = mha.in_proj_bias.chunk(3) if mha.in_proj_bias is not None else (None, None, None)
    return F.linear(query, wq, bq), F.linear(key, wk, bk), F.linear(value, wv, bv)


def _masked(scores: torch.Tensor, attn_mask, key_padding_mask, is_causal: bool) -> torch.Tensor:
    """Attention scores ``(B, H, T, S)`` with torch's masks applied (boolean: -inf where true; float: added)."""
    B, H, T, S = scores.shape
    if attn_mask is None and is_causal:
        attn_mask = torch.ones(T, S, dtype=torch.bool, device=scores.device).triu(1)
    if attn_mask is not None and attn_mask.dim() == 3:
        attn_mask = attn_mask.reshape(B, H, T, S)
    if key_padding_mask is not None:
        key_padding_mask = key_padding_mask.reshape(B, 1, 1, S)
    for m in (attn_mask, key_padding_mask):
        if m is not None:
            scores = scores.masked_fill(m, float("-inf")) if m.dtype == torch.bool else scores + m.to(scores.dtype)
    return scores


def _mha_attention(mha: nn.MultiheadAttention, q, k, v, attn_mask, key_padding_mask, is_causal: bool):
    """Softmax attention of ``(B, T, E)`` projections: the heads' outputs ``(B, T, E)`` and the weights ``(B, H, T, S)``."""
    E, H = mha.embed_dim, mha.num_heads
    hd = E // H
    B, T, S = q.shape[0], q.shape[1], k.shape[1]
    qh = q.reshape(B, T, H, hd).transpose(1, 2)
    kh = k.reshape(B, S, H, hd).transpose(1, 2)
    vh = v.reshape(B, S, H, hd).transpose(1, 2)
    attn = torch.softmax(_masked(qh @ kh.transpose(-2, -1) / math.sqrt(hd), attn_mask, key_padding_mask, is_causal),
                         dim=-1)
    if mha.training and mha.dropout > 0:
        attn = F.dropout(attn, p=mha.dropout)
    return (attn @ vh).transpose(1, 2).reshape(B, T, E), attn


def _mha_forward(cap: Captured, name: str, record: bool = True):
    """A decomposed forward for an ``nn.MultiheadAttention``, numerically equal to torch's (up to rounding: torch's
    own forward may use fused kernels); ``record=False``: the same computation, nothing recorded."""

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        if self.bias_k is not None or self.add_zero_attn:
            raise ValueError(f"capture: nn.MultiheadAttention {name!r} uses add_bias_kv/add_zero_attn, which is unsupported")
        unbatched = query.dim() == 2
        if unbatched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        if not self.batch_first:  # to (B, T, E)
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        q, k, v = _mha_projections(self, query, key, value)
        for part, inp, out in (("q", query, q), ("k", key, k), ("v", value, v)) if record else ():
            cap._record(f"{name}.{part}", inp, out)
        o, attn = _mha_attention(self, q, k, v, attn_mask, key_padding_mask, is_causal)
        out = F.linear(o, self.out_proj.weight, self.out_proj.bias)
        if record:
            cap._record(f"{name}.out_proj", o, out)
        out = out if self.batch_first else out.transpose(0, 1)
        weights = (attn.mean(1) if average_attn_weights else attn) if need_weights else None
        if unbatched:
            out = out.squeeze(1)
            weights = None if weights is None else weights.squeeze(0)
        return out, weights

    return forward


_MATMULS = frozenset({torch.matmul, torch.mm, torch.Tensor.matmul, torch.Tensor.mm, torch.Tensor.__matmul__})


class _ParamMatmul(torch.overrides.TorchFunctionMode):
    """Records ``x @ P`` for watched parameters ``P`` (right operand) under the parameter's name."""

    def __init__(self, cap: Captured, watch: dict[int, tuple[str, torch.Tensor]]):
        super().__init__()
        self.cap, self.watch = cap, watch

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _MATMULS and len(args) >= 2:
            hit = self.watch.get(id(args[1]))
            if hit is not None and hit[1] is args[1] and isinstance(args[0], torch.Tensor):
                self.cap._record(hit[0], args[0], out)
                self.cap.meta[hit[0]]["uses"] = self.cap.meta[hit[0]].get("uses", 0) + 1
        return out


def param_uses(cap: Captured, name: str) -> int:
    """How many times the bare parameter ``name`` was used as ``x @ P`` since the capture began."""
    return int(cap.meta.get(name, {}).get("uses", 0))


@contextlib.contextmanager
def capture(model: nn.Module, select=None, *, inputs: bool = True, outputs: bool = True,
            params=(), quiet=()) -> Iterator[Captured]:
    """Record inputs and outputs of the selected points of ``model`` while the block runs.

    ``params``: names of 2-D parameters used as bare projections ``x @ P`` (see the module docstring).
    ``quiet``: names of modules that compute as if they were captured but record nothing (an
    ``nn.MultiheadAttention`` among them runs the decomposed forward; other modules are left alone), so that a
    capture of fewer points runs the very same arithmetic as one of more.

    Examples
    --------
    >>> with capture(model, "blocks.*.mlp.fc1") as cap:           # doctest: +SKIP
    ...     loss = loss_fn(model, batch)
    ...     cap.backward(loss)
    ...     g = cap.output_grads["blocks.0.mlp.fc1"][0]            # dL/d(fc1 output)

    Hooks are removed and patched forwards restored when the block exits, even if it raises.
    """
    cap = Captured(record_inputs=inputs, record_outputs=outputs)
    handles = []
    patched: list[nn.Module] = []
    all_params = dict(model.named_parameters())
    watch: dict[int, tuple[str, torch.Tensor]] = {}
    for pname in params:
        if pname not in all_params:
            raise ValueError(f"params: {pname!r} is not a parameter of the model")
        if all_params[pname].ndim != 2:
            raise ValueError(f"params: {pname!r} has shape {tuple(all_params[pname].shape)}; a projection x @ P needs a "
                             "2-D parameter")
        watch[id(all_params[pname])] = (pname, all_params[pname])
        cap.modules[pname] = model
        cap.meta[pname] = {"uses": 0}
    mode = _ParamMatmul(cap, watch) if watch else contextlib.nullcontext()
    try:
        for name, mod in _select(model, select).items():
            if isinstance(mod, nn.MultiheadAttention):
                for p in mha_points(name):
                    cap.modules[p] = mod
                    cap.meta[p] = {"batch_first": True}
                mod.forward = types.MethodType(_mha_forward(cap, name), mod)  # type: ignore[method-assign]
                patched.append(mod)
                continue
            cap.modules[name] = mod
            cap.meta[name] = {}

            def hook(module, args, kwargs, output, _name=name):
                inp = args[0] if args else next((v for v in kwargs.values() if isinstance(v, torch.Tensor)), None)
                out = output[0] if isinstance(output, (tuple, list)) else output
                cap._record(_name, inp, out)

            handles.append(mod.register_forward_hook(hook, with_kwargs=True))
        mods = dict(model.named_modules())
        for name in quiet:
            found = mods.get(name)
            if isinstance(found, nn.MultiheadAttention) and found not in patched:
                found.forward = types.MethodType(_mha_forward(cap, name, record=False), found)  # type: ignore[method-assign]
                patched.append(found)
        with mode:
            yield cap
    finally:
        for h in handles:
            h.remove()
        for mod in patched:
            del mod.forward  # the instance attribute; the class's forward is visible again


@torch.no_grad()
def activations(model: nn.Module, X: torch.Tensor, layers, *, batch_size: int = 500) -> dict[str, np.ndarray]:
    """Outputs of the named modules on ``X`` (eval mode), flattened to float64 ``(n, features)``.

    ``layers`` is a list of module names (each must exist). Runs ``X`` in batches of ``batch_size``
    rows through :func:`capture`; every module's training flag is restored afterwards.
    """
    layers = list(layers)
    n = int(X.shape[0])
    with module_mode(model), capture(model, layers, inputs=False) as cap:
        for i in range(0, n, batch_size):
            model(X[i:i + batch_size])
        return {name: torch.cat([t.detach() for t in cap.outputs.get(name, [])]).reshape(n, -1).double().numpy()
                for name in layers}


def hook_count(model: nn.Module) -> int:
    """Number of forward hooks and patched forwards left on ``model`` (0 outside :func:`capture`)."""
    n = 0
    for m in model.modules():
        n += len(m._forward_hooks) + len(m._forward_pre_hooks) + ("forward" in m.__dict__)
    return n

