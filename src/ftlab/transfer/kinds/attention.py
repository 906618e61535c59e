"""``nn.MultiheadAttention``: four linear points ``<name>.q``, ``.k``, ``.v`` and ``.out_proj``.

The module computes its projections functionally, so capture runs a decomposed forward that records
the four points (:func:`ftlab.core.hooks.capture`); the module itself is hooked. Spec: the fused
``in_proj_weight`` is three ``weight`` rules on its q/k/v thirds (``part=(i, 3)``), or separate
``q/k/v_proj_weight``; biases likewise; ``out_proj`` as a linear layer. The module's own children
(``out_proj``) get no spec of their own. Affine per part, from the fused weights. ``add_bias_kv`` and
``add_zero_attn`` are refused. Its points pair with linear ones (the same rows and maps).
"""

from __future__ import annotations

from torch import nn

from ftlab.core.hooks import mha_points
from ftlab.transfer.kinds.base import AffineMap, LayerKind, Point, Rule, SpecContext, joined, register_kind

__all__ = ["AttentionKind"]


def _part(mha: nn.MultiheadAttention, tail: str) -> AffineMap:
    if tail == "out_proj":
        return mha.out_proj.weight.detach(), None if mha.out_proj.bias is None else mha.out_proj.bias.detach()
    i = "qkv".index(tail)
    if mha._qkv_same_embed_dim:
        W = mha.in_proj_weight.detach().chunk(3)[i]
    else:
        W = getattr(mha, f"{tail}_proj_weight").detach()
    return W, None if mha.in_proj_bias is None else mha.in_proj_bias.detach().chunk(3)[i]


def _in_proj_rules(name: str, mod: nn.MultiheadAttention, q: str, k: str, v: str) -> dict[str, tuple[Rule, ...]]:
    rules: dict[str, tuple[Rule, ...]] = {}
    if mod._qkv_same_embed_dim:
        w = joined(name, "in_proj_weight")
        rules[w] = tuple(Rule(w, "weight", p, (i, 3)) for i, p in enumerate((q, k, v)))
    else:
        for p, attr in ((q, "q_proj_weight"), (k, "k_proj_weight"), (v, "v_proj_weight")):
            rules[joined(name, attr)] = (Rule(joined(name, attr), "weight", p),)
    if mod.in_proj_bias is not None:
        b = joined(name, "in_proj_bias")
        rules[b] = tuple(Rule(b, "out_vector", p, (i, 3)) for i, p in enumerate((q, k, v)))
    return rules


class AttentionKind(LayerKind):
    name = "attention"
    family = "linear"
    owns_children = True

    def matches(self, module: nn.Module) -> bool:
        return isinstance(module, nn.MultiheadAttention)

    def spec(self, name: str, module: nn.Module, ctx: SpecContext) -> tuple[list[Point], dict[str, tuple[Rule, ...]]]:
        assert isinstance(module, nn.MultiheadAttention)
        if module.bias_k is not None or module.add_zero_attn:
            raise ValueError(f"module {name!r} (MultiheadAttention with add_bias_kv/add_zero_attn) is not supported")
        E = module.embed_dim
        q, k, v, o = mha_points(name)
        pts = [Point(q, self.name, E, E), Point(k, self.name, module.kdim, E), Point(v, self.name, module.vdim, E),
               Point(o, self.name, E, E)]
        rules = _in_proj_rules(name, module, q, k, v)
        ow, ob = joined(name, "out_proj.weight"), joined(name, "out_proj.bias")
        rules[ow] = (Rule(ow, "weight", o),)
        if module.out_proj.bias is not None:
            rules[ob] = (Rule(ob, "out_vector", o),)
        return pts, rules

    def hooked(self, point: Point) -> tuple[str, bool]:
        return point.name.rpartition(".")[0], False

    def affine(self, model: nn.Module, point: Point) -> AffineMap | None:
        head, _, tail = point.name.rpartition(".")
        mha = dict(model.named_modules()).get(head)
        return _part(mha, tail) if isinstance(mha, nn.MultiheadAttention) else None


register_kind(AttentionKind())
