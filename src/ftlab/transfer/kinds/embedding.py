"""``nn.Embedding``: a lookup table ``(vocab, d)``; its input space is the vocabulary.

Spec: one point whose input map is the identity (or a vocabulary index map) and the rule ``embedding``:
``tau_B = tau_A R_out``, rows taken through ``vocab[b]`` (the row of A's table that B's row ``b``
continues, -1 none: a zero delta) when the vocabularies differ, e.g. MPNet's id = BERT's id + 4
(:func:`vocab_maps`, from ``TransferOptions.vocab_map``). Tables indexed by relative-position buckets
rather than tokens (:data:`RELATIVE_BIAS`: T5, MPNet; ``num_buckets x heads``, mapped on the head axis) are
points whose rows are no tokens, so no padding mask applies. LoRA: ``lora_embedding_A``/``_B`` with the
delta ``(B A)^T``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

from ftlab.transfer.factored import right
from ftlab.transfer.kinds.base import (
    Carry,
    LayerKind,
    Point,
    Rule,
    RuleKind,
    SpecContext,
    joined,
    register_kind,
    register_rule,
)

__all__ = ["RELATIVE_BIAS", "EmbeddingKind", "as_vocab_map", "vocab_maps"]

#: Module-name globs of embeddings indexed by relative-position buckets rather than by the batch's tokens
#: (T5, MPNet): their rows are ``(query, key)`` position pairs, so no padding mask applies to them.
RELATIVE_BIAS: tuple[str, ...] = ("*relative_attention_bias*",)


def _embedding(rule: Rule, T: torch.Tensor, shape: tuple[int, ...], R_in, R_out, carry: Carry) -> torch.Tensor:
    if T.shape[1] != R_out.shape[0]:
        raise ValueError(f"source embedding {carry.src!r} has width {T.shape[1]}, expected {R_out.shape[0]}")
    vocab = carry.vocab
    if vocab is not None:
        rows = T[vocab.clamp_min(0)] * (vocab >= 0).to(T.dtype)[:, None]
        return right(rows, R_out)
    if T.shape[0] != shape[0]:
        raise ValueError(f"embedding {rule.param!r}: source vocabulary {T.shape[0]} != target vocabulary {shape[0]}; "
                         "give vocab_map= (target row -> source row) or zero it with zero_params")
    return right(T, R_out)


register_rule(RuleKind("embedding", _embedding))


class EmbeddingKind(LayerKind):
    name = "embedding"
    has_input_map = False
    lora_name = "embedding"

    def matches(self, module: nn.Module) -> bool:
        return isinstance(module, nn.Embedding)

    def spec(self, name: str, module: nn.Module, ctx: SpecContext) -> tuple[list[Point], dict[str, tuple[Rule, ...]]]:
        assert isinstance(module, nn.Embedding)
        tokens = not any(fnmatch.fnmatchcase(name, pat) for pat in RELATIVE_BIAS)
        pt = Point(name, self.name, int(module.num_embeddings), int(module.embedding_dim), tokens=tokens)
        w = joined(name, "weight")
        return [pt], {w: (Rule(w, "embedding", name),)}

    def lora_matrix(self, module: nn.Module, delta: torch.Tensor) -> torch.Tensor | None:
        return delta.T

    def lora_tensors(self, key: str, B: torch.Tensor, A: torch.Tensor, module: nn.Module) -> dict[str, torch.Tensor]:
        return {f"{key}.lora_embedding_A": A, f"{key}.lora_embedding_B": B}

    def lora_delta(self, module: nn.Module, A: torch.Tensor, B: torch.Tensor, fan_in_fan_out: bool,
                   where: str) -> torch.Tensor:
        return (B @ A).T


register_kind(EmbeddingKind())


def as_vocab_map(index, v_a: int, v_b: int, name: str) -> torch.Tensor:
    """Validate an index map of B's vocabulary into A's: a ``(V_B,)`` integer tensor with entries in ``[-1, V_A)``."""
    idx = torch.as_tensor(index)
    if idx.ndim != 1 or idx.shape[0] != v_b or idx.is_floating_point():
        raise ValueError(f"vocab_map for {name!r} must be {v_b} integers (one per row of the target table), "
                         f"got shape {tuple(idx.shape)}")
    idx = idx.long()
    if len(idx) and (int(idx.min()) < -1 or int(idx.max()) >= v_a):
        raise ValueError(f"vocab_map for {name!r} has entries outside [-1, {v_a - 1}] (the source vocabulary)")
    return idx


def vocab_maps(vm: Mapping | Sequence | None, source: nn.Module, target: nn.Module,
               source_name: Callable[[str], str | None]) -> dict[str, torch.Tensor]:
    """Validated vocabulary index maps ``{target table: (V_B,) indices}`` (see ``TransferOptions.vocab_map``).

    ``vm`` maps target tables to index lists, or is one index list applied to every target table with that
    many rows; ``source_name(target parameter)`` gives its source parameter (the depth map).
    """
    if vm is None:
        return {}
    sp = dict(source.named_parameters())
    tables = {joined(n, "weight"): m for n, m in target.named_modules() if isinstance(m, nn.Embedding)}
    out: dict[str, torch.Tensor] = {}
    if isinstance(vm, Mapping):
        for name, idx in vm.items():
            if name not in tables:
                raise ValueError(f"vocab_map names {name!r}, which is not an embedding table of the target")
            src = source_name(name)
            if src is None or src not in sp:
                raise ValueError(f"vocab_map: embedding {name!r} has no counterpart in the source")
            out[name] = as_vocab_map(idx, int(sp[src].shape[0]), int(tables[name].num_embeddings), name)
        return out
    for name, mod in tables.items():
        src = source_name(name)
        if mod.num_embeddings == len(vm) and src is not None and src in sp:
            out[name] = as_vocab_map(vm, int(sp[src].shape[0]), int(mod.num_embeddings), name)
    if not out:
        raise ValueError(f"vocab_map has {len(vm)} entries but no target embedding table has {len(vm)} rows")
    return out
