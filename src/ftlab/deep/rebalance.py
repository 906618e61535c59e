"""Exact, function-preserving rebalancing of a network's layer scales: :func:`rebalance_`.

A ReLU network without normalization is positively homogeneous in each layer: multiplying a
layer's weights by ``f > 0`` multiplies everything downstream by ``f``. So the function is
unchanged by any per-layer factors whose product along **every** input-to-output path is 1 (the
neuron-wise rescaling symmetry behind the conserved quantities of gradient flow; Du, Hu, Lee 2018,
arXiv 1806.00900; Kunin et al. 2024, arXiv 2406.06158). :func:`rebalance_` moves weight norm from
the early layers to the late ones (``kappa < 1``) or back (``kappa > 1``) along such factors -- the
deep-network analogue of the relative scale lambda of the diagonal-network theory (Anguita et al.
2026, arXiv 2602.20062), applied either at initialization (as lambda_PT) or to a trained network.
With ``scale != 1`` it multiplies the network's output by ``scale`` exactly instead of keeping it,
spreading the factor over the layers: ftlab's analogue of the absolute scale c_PT for a network
without normalization, where multiplying every layer by ``s`` would multiply the output by
``s^depth`` (``s^26`` along the deepest path of a ResNet-18).

How the factors are found (ftlab's construction)
------------------------------------------------
The model is traced with ``torch.fx``; every *weighted unit* (``nn.Linear``, ``nn.Conv1d/2d/3d``,
``nn.ConvTranspose*``, ``nn.Embedding``, ``F.linear``/``F.conv*`` on a parameter, ``x @ P`` or
``x * p`` with a parameter ``P``/``p``) gets an unknown log-factor ``u_j``. The log-scale of every
tensor in the graph is then a linear function of ``u``: a unit adds its ``u_j``, positively
homogeneous operations (ReLU, LeakyReLU, PReLU, pooling, reshapes, indexing, dropout) keep it, a
product of two tensors adds their scales. Function preservation is a set of linear constraints:
both operands of a sum (a residual connection) and all inputs of a concatenation have the same
scale, and every output has scale ``log(scale)`` (0: the function is preserved). Each unit's
*target* is ``log(kappa) * (1 - 2 d_j) + log(scale) / D``, with ``d_j`` in [0, 1] its depth fraction
(longest path of weighted units from the input, first unit 0, deepest unit -- the readout -- 1) and
``D`` the number of units on the deepest path, so the first layer is multiplied by ``kappa`` and the
readout by ``1/kappa``; the applied log-factors are the target's least-squares projection onto the
constraints (closest to the target in the Euclidean norm of the log-factors). In a plain chain that
*is* the target (its log-factors already sum to ``log(scale)``); in a residual network, each identity
block's branch factors multiply to 1 and the scale of the residual stream changes only at the stem,
the projection shortcuts and the readout.

Biases are not a problem: a bias is scaled by the cumulative factor of its unit's output (``b ->
f_1 ... f_j b``), which keeps the function exact for ReLU networks, so networks with biases are
accepted. Refused, with a one-line ``ValueError`` naming the culprit: normalization layers
(``normalization="refuse"``, default; see below), activations that are not positively homogeneous
of degree 1 (GELU, SiLU, sigmoid, tanh, softplus, ELU, ReLU6, ...), attention modules, adding a
constant or a buffer, parameters shared between units, networks ``torch.fx`` cannot trace, and
networks with fewer than two weighted layers on a path.

Normalization layers
--------------------
BatchNorm, LayerNorm, GroupNorm and RMSNorm divide out the scale of their input. With
``normalization="absorb"`` a normalization layer resets the scale to that of its (unscaled) affine
parameters, so the weights feeding it can take their target factors freely: the function is
unchanged (up to the layers' ``eps``; BatchNorm running statistics are rescaled with them), and the
readout must keep factor 1 because its input is normalized. Such a rescale changes only the
*effective learning rate* of the scale-invariant weights, by ``1/f^2`` under SGD (van Laarhoven
2017, arXiv 1706.05350); the record reports it per unit.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import fx, nn
from torch.nn import functional as F

from ftlab.core.usercode import check_model
from ftlab.core.validate import check_choice, check_positive

__all__ = ["RebalanceRecord", "UnitFactor", "rebalance_"]

Normalization = Literal["refuse", "absorb"]
Vec = dict[int, float]  # sparse linear form over the units' log-factors

_WEIGHTED_MODULES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
                     nn.ConvTranspose3d, nn.Embedding)
_HOMOGENEOUS_MODULES = (nn.ReLU, nn.LeakyReLU, nn.PReLU, nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d,
                        nn.AvgPool2d, nn.AvgPool3d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
                        nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d, nn.Flatten, nn.Unflatten,
                        nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.ZeroPad1d, nn.ZeroPad2d,
                        nn.ZeroPad3d, nn.Upsample, nn.PixelShuffle, nn.PixelUnshuffle)
_NORM_MODULES: tuple[type, ...] = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, nn.RMSNorm)
_NONHOMOGENEOUS = (nn.GELU, nn.SiLU, nn.Sigmoid, nn.Tanh, nn.Softplus, nn.ELU, nn.SELU, nn.CELU, nn.ReLU6,
                   nn.Hardtanh, nn.Hardswish, nn.Hardsigmoid, nn.Mish, nn.Softmax, nn.LogSoftmax, nn.Softsign,
                   nn.Tanhshrink, nn.Threshold, nn.LocalResponseNorm)

_SAME_FUNCS: set[Any] = {
    torch.relu, F.relu, F.leaky_relu, F.prelu, torch.flatten, torch.reshape, F.max_pool1d, F.max_pool2d, F.max_pool3d,
    F.avg_pool1d, F.avg_pool2d, F.avg_pool3d, F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_avg_pool3d,
    F.adaptive_max_pool1d, F.adaptive_max_pool2d, F.dropout, F.dropout1d, F.dropout2d, torch.transpose, torch.permute,
    torch.squeeze, torch.unsqueeze, torch.mean, torch.sum, operator.getitem, operator.neg, torch.clone, torch.narrow,
    F.interpolate, torch.chunk, torch.split, torch.amax, torch.movedim, torch.swapaxes,
}
_SUM_FUNCS: set[Any] = {operator.add, torch.add, operator.sub, torch.sub, operator.iadd, operator.isub}
_CAT_FUNCS: set[Any] = {torch.cat, torch.stack, torch.concat}
_MUL_FUNCS: set[Any] = {operator.mul, torch.mul, operator.imul}
_DIV_FUNCS: set[Any] = {operator.truediv, torch.div, operator.itruediv}
_MATMUL_FUNCS: set[Any] = {operator.matmul, torch.matmul, torch.mm, torch.bmm}
_LINEAR_FUNCS: set[Any] = {F.linear, F.conv1d, F.conv2d, F.conv3d, F.conv_transpose1d, F.conv_transpose2d,
                           F.conv_transpose3d}
_SAME_METHODS = {"relu", "relu_", "view", "reshape", "flatten", "mean", "sum", "permute", "transpose", "contiguous",
                 "unsqueeze", "squeeze", "clone", "expand", "repeat", "flip", "chunk", "split", "narrow", "__getitem__",
                 "to", "float", "double", "amax", "view_as", "reshape_as", "expand_as", "neg", "t", "movedim"}
_SUM_METHODS = {"add", "add_", "sub", "sub_", "__add__", "__sub__", "__iadd__"}
_MUL_METHODS = {"mul", "mul_", "__mul__"}
_DIV_METHODS = {"div", "div_", "__truediv__"}
_MATMUL_METHODS = {"matmul", "mm", "bmm", "__matmul__"}
_SHAPE_METHODS = {"size", "dim", "numel", "nelement"}


@dataclass(frozen=True)
class UnitFactor:
    """One weighted unit: its name, depth fraction, target and applied weight factor.

    ``normalized`` is True when the unit's output is divided out by a normalization layer (then
    its weights are scale-invariant and ``lr_factor = 1/factor^2`` is the change of their effective
    SGD learning rate; otherwise ``lr_factor`` is nan). ``bias_factor`` is the factor applied to the
    unit's bias (the cumulative scale of its output; nan without a bias).
    """

    name: str
    depth: float
    target: float
    factor: float
    bias_factor: float
    normalized: bool
    lr_factor: float


@dataclass(frozen=True)
class RebalanceRecord:
    """What :func:`rebalance_` did: kappa, the output scale, the normalization mode, one
    :class:`UnitFactor` per weighted unit (forward order), and ``residual``, the largest violation of
    the constraints by the applied log-factors (float64 rounding, ~1e-15)."""

    kappa: float
    scale: float
    normalization: str
    units: tuple[UnitFactor, ...]
    residual: float

    def factor(self, name: str) -> float:
        """The weight factor of the unit ``name``; ``ValueError`` if there is none."""
        for u in self.units:
            if u.name == name:
                return u.factor
        raise ValueError(f"no weighted unit named {name!r}; units: {[u.name for u in self.units]}")


@dataclass
class _Unit:
    name: str
    weight: str  # parameter name of the weight
    bias: str | None
    depth: int = 0
    out: Vec | None = None


def _add(a: Vec, b: Vec, sign: float = 1.0) -> Vec:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0.0) + sign * v
    return {k: v for k, v in out.items() if v != 0.0}


class _Analysis:
    """Walk an fx graph, assigning every tensor a linear form (sparse) over the units' log-factors."""

    def __init__(self, model: nn.Module, gm: fx.GraphModule, normalization: str):
        self.model = model
        self.gm = gm
        self.normalization = normalization
        self.modules = dict(model.named_modules())
        self.params = dict(model.named_parameters(remove_duplicate=False))
        self.buffers = dict(model.named_buffers())
        self.units: list[_Unit] = []
        self.unit_of: dict[str, int] = {}
        self.vec: dict[fx.Node, Vec] = {}
        self.depth: dict[fx.Node, int] = {}
        self.kind: dict[fx.Node, str] = {}  # "tensor", "shape" (non-tensor), "param", "buffer", "const"
        self.constraints: list[Vec] = []  # linear forms that must vanish
        self.outputs: list[Vec] = []  # linear forms that must equal log(scale)
        self.bias_like: list[tuple[str, Vec]] = []
        self.norm_inputs: list[tuple[str, Vec]] = []
        self.normalized: set[int] = set()

    # ---------------------------------------------------------------------------------- helpers
    def _unit(self, name: str, weight: str, bias: str | None) -> int:
        if name in self.unit_of:
            return self.unit_of[name]
        self.units.append(_Unit(name, weight, bias))
        self.unit_of[name] = len(self.units) - 1
        return len(self.units) - 1

    def _tensor_args(self, node: fx.Node) -> list[fx.Node]:
        found: list[fx.Node] = []

        def collect(n: fx.Node) -> fx.Node:
            found.append(n)
            return n

        fx.node.map_arg((node.args, node.kwargs), collect)
        return [n for n in found if self.kind.get(n) == "tensor"]

    def _set(self, node: fx.Node, vec: Vec, depth: int) -> None:
        self.kind[node] = "tensor"
        self.vec[node] = vec
        self.depth[node] = depth

    def _same(self, node: fx.Node, src: list[fx.Node]) -> None:
        """Output has the scale of its tensor inputs, which must all agree (sum / concat)."""
        if not src:
            self.kind[node] = "shape"
            return
        first = self.vec[src[0]]
        for other in src[1:]:
            diff = _add(first, self.vec[other], -1.0)
            if diff:
                self.constraints.append(diff)
        self._set(node, dict(first), max(self.depth[s] for s in src))

    def _param_name(self, node: Any) -> str | None:
        if isinstance(node, fx.Node) and node.op == "get_attr" and str(node.target) in self.params:
            return str(node.target)
        return None

    def _weighted(self, node: fx.Node, name: str, weight: str, bias: str | None, src: fx.Node | None) -> None:
        j = self._unit(name, weight, bias)
        base = self.vec[src] if src is not None else {}
        vec = _add(base, {j: 1.0})
        depth = (self.depth[src] if src is not None else 0) + 1
        unit = self.units[j]
        unit.depth = max(unit.depth, depth)
        if unit.out is not None and unit.bias is not None:  # a module used twice: one bias factor for both uses
            diff = _add(unit.out, vec, -1.0)
            if diff:
                self.constraints.append(diff)
        unit.out = vec
        self._set(node, vec, depth)

    # ---------------------------------------------------------------------------------- nodes
    def run(self) -> None:
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self._set(node, {}, 0)
            elif node.op == "get_attr":
                t = str(node.target)
                self.kind[node] = "param" if t in self.params else "buffer" if t in self.buffers else "const"
            elif node.op == "call_module":
                self._module(node)
            elif node.op == "call_function":
                self._function(node, node.target, list(node.args), dict(node.kwargs))
            elif node.op == "call_method":
                self._method(node)
            elif node.op == "output":
                outs = self._tensor_args(node)
                if not outs:
                    raise ValueError(f"{type(self.model).__name__} returns no tensor: nothing to rebalance")
                for o in outs:
                    self.outputs.append(dict(self.vec[o]))

    def _module(self, node: fx.Node) -> None:
        name = str(node.target)
        mod = self.modules[name]
        src = self._tensor_args(node)
        if isinstance(mod, _WEIGHTED_MODULES):
            bias = getattr(mod, "bias", None)
            self._weighted(node, name, f"{name}.weight", f"{name}.bias" if bias is not None else None,
                           None if isinstance(mod, nn.Embedding) else (src[0] if src else None))
        elif isinstance(mod, _NORM_MODULES):
            if self.normalization == "refuse":
                raise ValueError(f"rebalance_ cannot preserve the function of {type(self.model).__name__}: {name} is a "
                                 f"{type(mod).__name__}, which divides out the scale of its input (pass "
                                 "normalization='absorb' to rescale the weights before it; only their effective "
                                 "learning rate changes)")
            vin = self.vec[src[0]]
            self.norm_inputs.append((name, vin))
            self.normalized.update(vin)
            self._set(node, {}, self.depth[src[0]])
        elif isinstance(mod, _HOMOGENEOUS_MODULES):
            self._same(node, src[:1])
        elif isinstance(mod, _NONHOMOGENEOUS):
            raise ValueError(f"rebalance_ cannot preserve the function of {type(self.model).__name__}: {name} is a "
                             f"{type(mod).__name__}, which is not positively homogeneous of degree 1 (use ReLU, "
                             "LeakyReLU or PReLU)")
        else:
            raise ValueError(f"rebalance_ cannot preserve the function of {type(self.model).__name__}: module {name} "
                             f"({type(mod).__name__}) is not a supported weighted, homogeneous or normalization layer")

    def _function(self, node: fx.Node, fn: Callable, args: list, kwargs: dict) -> None:
        src = self._tensor_args(node)
        what = getattr(fn, "__name__", str(fn))
        if fn is getattr:
            self.kind[node] = "shape"
        elif not src:  # arithmetic on sizes, constants
            self.kind[node] = "shape"
        elif fn in _LINEAR_FUNCS:
            w = self._param_name(args[1] if len(args) > 1 else kwargs.get("weight"))
            b_node = args[2] if len(args) > 2 else kwargs.get("bias")
            b = self._param_name(b_node)
            if w is None or (b_node is not None and b is None):
                raise ValueError(f"rebalance_ cannot preserve the function of {type(self.model).__name__}: {node.name} "
                                 f"calls {what} with a weight or bias that is not a parameter of the model")
            self._weighted(node, w.rsplit(".", 1)[0] if w.endswith(".weight") else w, w, b, args[0])
        elif fn in _SUM_FUNCS:
            self._sum(node, args, what)
        elif fn in _CAT_FUNCS:
            self._same(node, src)
        elif fn in _MUL_FUNCS or fn in _MATMUL_FUNCS:
            self._product(node, args, what)
        elif fn in _DIV_FUNCS:
            if len(src) != 1 or not (isinstance(args[0], fx.Node) and args[0] is src[0]) or \
                    any(isinstance(a, fx.Node) and self.kind.get(a) in ("param", "buffer") for a in args[1:]):
                raise ValueError(f"rebalance_ cannot preserve the function of {type(self.model).__name__}: {node.name} "
                                 "divides by a tensor or parameter")
            self._same(node, src)
        elif fn in _SAME_FUNCS:
            self._same(node, src[:1])
        else:
            raise ValueError(f"rebalance_ cannot preserve the function of {type(self.model).__name__}: {node.name} "
                             f"calls {what}, which is not known to be positively homogeneous of degree 1")

    def _method(self, node: fx.Node) -> None:
        m = str(node.target)
        src = self._tensor_args(node)
        if m in _SHAPE_METHODS or not src:
            self.kind[node] = "shape"
        elif m in _SAME_METHODS:
            self._same(node, src[:1])
        elif m in _SUM_METHODS:
            self._sum(node, list(node.args), m)
        elif m in _MUL_METHODS or m in _MATMUL_METHODS:
            self._product(node, list(node.args), m)
        elif m in _DIV_METHODS:
            self._function(node, operator.truediv, list(node.args), dict(node.kwargs))
        else:
            raise ValueError(f"rebalance_ cannot preserve the function of {type(self.model).__name__}: {node.name} "
                             f"calls .{m}(), which is not known to be positively homogeneous of degree 1")

    def _sum(self, node: fx.Node, args: list, what: str) -> None:
        tensors = [a for a in args[:2] if isinstance(a, fx.Node) and self.kind.get(a) == "tensor"]
        params = [a for a in args[:2] if self._param_name(a) is not None]
        others = [a for a in args[:2] if a not in tensors and a not in params]
        if len(tensors) == 2:
            self._same(node, tensors)
        elif len(tensors) == 1 and len(params) == 1:  # a bias added by hand: scaled with the tensor
            self.bias_like.append((str(params[0].target), dict(self.vec[tensors[0]])))
            self._same(node, tensors)
        elif len(tensors) == 1 and all(isinstance(o, (int, float)) and o == 0 for o in others) and not params:
            self._same(node, tensors)
        else:
            raise ValueError(f"rebalance_ cannot preserve the function of {type(self.model).__name__}: {node.name} "
                             f"({what}) adds a constant or a buffer to a tensor, which is not homogeneous")

    def _product(self, node: fx.Node, args: list, what: str) -> None:
        a, b = args[0], args[1]
        ka = self.kind.get(a) if isinstance(a, fx.Node) else "number"
        kb = self.kind.get(b) if isinstance(b, fx.Node) else "number"
        if ka == "tensor" and kb == "tensor":
            self._set(node, _add(self.vec[a], self.vec[b]), max(self.depth[a], self.depth[b]))
        elif {ka, kb} == {"tensor", "param"}:
            t, p = (a, b) if ka == "tensor" else (b, a)
            pname = str(p.target)
            self._weighted(node, pname, pname, None, t)
        elif {ka, kb} <= {"tensor", "number", "shape"}:
            self._same(node, [x for x in (a, b) if isinstance(x, fx.Node) and self.kind.get(x) == "tensor"])
        else:
            raise ValueError(f"rebalance_ cannot preserve the function of {type(self.model).__name__}: {node.name} "
                             f"({what}) multiplies by a buffer or constant tensor")


def _trace(model: nn.Module) -> fx.GraphModule:
    try:
        return fx.symbolic_trace(model)
    except Exception as exc:  # noqa: BLE001 - any tracing failure is the same user error
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"rebalance_ cannot trace {type(model).__name__} with torch.fx ({first[:160]}); it needs a "
                         "model without data-dependent control flow") from None


def _check_units(model: nn.Module, an: _Analysis, scale: float) -> None:
    """Refuse a network whose units cannot take their own factors: none or one on every path, a parameter shared by
    two units, or (for ``scale != 1``) an output that depends on no unit."""
    if not an.units:
        raise ValueError(f"{type(model).__name__} has no weighted layer (Linear, Conv, Embedding or parameter "
                         "product): nothing to rebalance")
    seen: dict[int, str] = {}
    for u in an.units:
        for pn in (u.weight, u.bias):
            if pn is None:
                continue
            key = id(an.params[pn])
            if key in seen and seen[key] != pn:
                raise ValueError(f"rebalance_ cannot rescale {type(model).__name__}: parameter {pn} is shared with "
                                 f"{seen[key]}, so the two units cannot take different factors")
            seen[key] = pn
    if max(u.depth for u in an.units) < 2:
        raise ValueError(f"{type(model).__name__} has a single weighted layer on every path: a rebalance needs at "
                         "least two")
    if scale != 1.0 and any(not o for o in an.outputs):
        raise ValueError(f"an output of {type(model).__name__} depends on no weighted layer (e.g. after a "
                         "normalization): its scale cannot be changed")


def _log_factors(an: _Analysis, target: np.ndarray, scale: float) -> tuple[np.ndarray, float]:
    """The log factors closest to ``target`` whose sums along every path are ``log(scale)`` (0 for the internal
    constraints), and the largest constraint residual."""
    rows = an.constraints + [o for o in an.outputs if o]
    rhs = np.array([0.0] * len(an.constraints) + [math.log(scale)] * (len(rows) - len(an.constraints)))
    C = np.zeros((len(rows), len(an.units)))
    for i, row in enumerate(rows):
        for k, v in row.items():
            C[i, k] = v
    if not rows:
        return target, 0.0
    u_log = target + np.linalg.lstsq(C, rhs - C @ target, rcond=None)[0]
    return u_log, float(np.max(np.abs(C @ u_log - rhs)))


def _rescale_(an: _Analysis, u_log: np.ndarray, d: np.ndarray, target: np.ndarray) -> list[UnitFactor]:
    """Multiply every unit's weight by its factor and biases, hand-added biases and the running statistics of
    absorbed norm layers by the cumulative factor of their tensor (in place); one record per unit."""
    def cumulative(vec: Vec) -> float:
        return math.exp(sum(v * u_log[k] for k, v in vec.items()))

    records = []
    for j, unit in enumerate(an.units):
        f = math.exp(u_log[j])
        an.params[unit.weight].mul_(f)
        bf = math.nan
        if unit.bias is not None:
            bf = cumulative(unit.out or {})
            an.params[unit.bias].mul_(bf)
        normed = j in an.normalized
        records.append(UnitFactor(unit.name, float(d[j]), math.exp(target[j]), f, bf, normed,
                                  1.0 / (f * f) if normed else math.nan))
    for pname, vec in an.bias_like:
        an.params[pname].mul_(cumulative(vec))
    for mname, vec in an.norm_inputs:
        mod = an.modules[mname]
        s = cumulative(vec)
        mean, var = getattr(mod, "running_mean", None), getattr(mod, "running_var", None)
        if isinstance(mean, torch.Tensor):
            mean.mul_(s)
        if isinstance(var, torch.Tensor):
            var.mul_(s * s)
    return records


def rebalance_(model: nn.Module, kappa: float = 1.0, *, scale: float = 1.0,
               normalization: Normalization = "refuse") -> RebalanceRecord:
    """Move weight norm between early and late layers (in place) keeping the function, or scaling it.

    Every weighted unit ``j`` is multiplied by ``exp(u_j)``, where ``u`` is the least-squares
    projection of the target ``log(kappa) * (1 - 2 d_j) + log(scale) / D`` (``d_j`` = depth fraction,
    0 for the first layer, 1 for the deepest, the readout; ``D`` = units on the deepest path) onto the
    factors whose product along every input-to-output path is ``scale``; biases and hand-added bias
    parameters are multiplied by the cumulative factor of the tensor they are added to. So the new
    network computes ``scale * f(x)`` exactly (``f(x)`` for the default ``scale=1``). ``kappa < 1``
    makes the early layers smaller and the readout larger (the analogue of lambda_PT < 0);
    ``kappa = scale = 1`` changes nothing.

    normalization : ``"refuse"`` (default) raises ``ValueError`` on any normalization layer;
        ``"absorb"`` treats it as resetting the scale (see the module docs): the function is kept up
        to the layers' ``eps``, BatchNorm running statistics are rescaled, and the record gives each
        scale-invariant unit's effective learning-rate factor ``1/f^2``.

    Returns a :class:`RebalanceRecord`. Raises a one-line ``ValueError`` for networks whose function
    no rescale preserves (see the module docs for the list) and for ``kappa <= 0`` or ``scale <= 0``.
    """
    check_model("model", model)
    check_positive("kappa", kappa)
    check_positive("scale", scale)
    check_choice("normalization", normalization, ("refuse", "absorb"))
    an = _Analysis(model, _trace(model), normalization)
    an.run()
    _check_units(model, an, scale)
    deepest = max(u.depth for u in an.units)
    d = np.array([(u.depth - 1) / (deepest - 1) for u in an.units])
    target = math.log(kappa) * (1.0 - 2.0 * d) + math.log(scale) / deepest
    u_log, residual = _log_factors(an, target, scale)
    if residual > 1e-9:
        raise ValueError(f"rebalance_ found no exact factors for {type(model).__name__} (constraint residual "
                         f"{residual:.2e})")
    with torch.no_grad():
        records = _rescale_(an, u_log, d, target)
    return RebalanceRecord(float(kappa), float(scale), normalization, tuple(records), residual)
