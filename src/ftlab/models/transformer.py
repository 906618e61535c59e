"""A small decoder-style Transformer for modular arithmetic, in plain torch.

Input: the token sequence ``[a, b, =]`` with ``a, b`` in ``0..n_tokens-1`` (the ``=`` token has id
``n_tokens``); output: logits over ``n_classes`` read at the last position. The architecture follows
the one-layer grokking Transformers of Power et al. (2022) and Nanda et al. (2023): token and
position embeddings, ``n_layers`` blocks of causal multi-head attention and a ReLU MLP with
residual connections, **no LayerNorm** (so the scales of the embedding and of the readout are not
normalized away, which is what a balancedness intervention acts on), and a linear readout
``unembed``.

Attributes used by :mod:`ftlab.deep.interventions` (balancedness and the function-preserving stream
rescale): ``ftlab_embedding = "embed"``, ``ftlab_positional = "pos"``, ``ftlab_readout = "unembed"``.
"""

from __future__ import annotations

import torch
from torch import nn

from ftlab.core.validate import check_int

__all__ = ["ModularTransformer", "modular_transformer"]


class _Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_mlp: int):
        super().__init__()
        self.attn = nn.MultiheadAttention(d_model, n_heads, bias=False, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_mlp), nn.ReLU(), nn.Linear(d_mlp, d_model))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x, x, x, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(x)


class ModularTransformer(nn.Module):
    """``(n, 3)`` int64 token ids -> ``(n, n_classes)`` logits read at the ``=`` position."""

    ftlab_embedding = "embed"
    ftlab_positional = "pos"
    ftlab_readout = "unembed"

    def __init__(self, *, n_tokens: int, n_classes: int, d_model: int = 64, n_heads: int = 4, d_mlp: int = 128,
                 n_layers: int = 1):
        super().__init__()
        self.n_tokens = check_int("n_tokens", n_tokens, minimum=2)
        check_int("n_classes", n_classes, minimum=2)
        check_int("d_model", d_model, minimum=1)
        check_int("n_heads", n_heads, minimum=1)
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is invalid: must be a multiple of n_heads={n_heads}")
        self.embed = nn.Embedding(n_tokens + 1, d_model)
        nn.init.normal_(self.embed.weight, std=d_model**-0.5)  # O(1) token vectors, as the position embeddings
        self.pos = nn.Parameter(torch.randn(3, d_model) / d_model**0.5)
        self.blocks = nn.ModuleList(_Block(d_model, n_heads, d_mlp) for _ in range(check_int("n_layers", n_layers, 1)))
        self.unembed = nn.Linear(d_model, n_classes)
        self.register_buffer("mask", torch.triu(torch.full((3, 3), float("-inf")), diagonal=1), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos
        for blk in self.blocks:
            x = blk(x, self.mask)
        return self.unembed(x[:, -1])


def modular_transformer(*, n_tokens: int, n_classes: int, d_model: int = 64, n_heads: int = 4, d_mlp: int = 128,
                        n_layers: int = 1, seed: int | None = None) -> ModularTransformer:
    """A freshly initialized :class:`ModularTransformer` (``seed`` makes it reproducible)."""
    kw = dict(n_tokens=n_tokens, n_classes=n_classes, d_model=d_model, n_heads=n_heads, d_mlp=d_mlp, n_layers=n_layers)
    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return ModularTransformer(**kw)
    return ModularTransformer(**kw)
