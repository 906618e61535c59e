"""A small Vision Transformer (Dosovitskiy et al. 2021, arXiv 2010.11929) in plain torch.

Built only from ``nn.Linear``, ``nn.LayerNorm`` and ``nn.Embedding`` so that generic tools
(hooks, the transport spec of :mod:`ftlab.transfer`) understand every parameter:

* patch embedding: ``patch_embed`` is an ``nn.Linear(patch*patch*channels, width)`` applied to
  non-overlapping patches (equivalent to the usual stride-``patch`` convolution);
* the class token and the learned positional embeddings are ``nn.Embedding`` tables
  (``cls_token``: 1 row, ``pos_embed``: ``n_patches + 1`` rows) called on index tensors, so
  forward hooks see them like any other embedding;
* pre-norm blocks ``blocks.<i>``: ``ln1 -> attn (q, k, v, out: separate nn.Linear) -> +``,
  ``ln2 -> mlp (fc1 -> GELU -> fc2) -> +``;
* ``ln_final`` then the classification head ``head`` (``nn.Linear(width, n_classes)``) on the
  class token.

Shapes: input images ``(n, H, W)`` or ``(n, C, H, W)`` (float, any scale), logits
``(n, n_classes)``; :meth:`ViT.features` returns the normalized class-token features
``(n, width)``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ftlab.core.validate import check_int

__all__ = ["ViTConfig", "ViT"]


@dataclass(frozen=True)
class ViTConfig:
    """Architecture of :class:`ViT`.

    image_size : side of the square input image (pixels); must be a multiple of ``patch``.
    patch : side of a square patch (pixels).
    channels : input channels (1 for grayscale).
    width : residual-stream width (model dimension); a multiple of ``heads``.
    depth : number of transformer blocks.
    heads : attention heads per block.
    mlp_ratio : hidden width of the MLP as a multiple of ``width``.
    n_classes : output classes of ``head``.
    """

    image_size: int = 28
    patch: int = 7
    channels: int = 1
    width: int = 64
    depth: int = 4
    heads: int = 4
    mlp_ratio: int = 2
    n_classes: int = 10

    def __post_init__(self):
        for name in ("image_size", "patch", "channels", "width", "depth", "heads", "mlp_ratio", "n_classes"):
            check_int(name, getattr(self, name), 1)
        if self.image_size % self.patch:
            raise ValueError(f"patch={self.patch} is out of range: must divide image_size={self.image_size}")
        if self.width % self.heads:
            raise ValueError(f"heads={self.heads} is out of range: must divide width={self.width}")

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch) ** 2

    def to_dict(self) -> dict:
        return asdict(self)


class Attention(nn.Module):
    """Multi-head self-attention with separate ``q``, ``k``, ``v`` and ``out`` projections."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, width)
        self.v = nn.Linear(width, width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        h = self.heads

        def split(y):
            return y.view(n, t, h, d // h).transpose(1, 2)

        y = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)))
        return self.out(y.transpose(1, 2).reshape(n, t, d))


class MLP(nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, mlp_ratio: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = MLP(width, mlp_ratio * width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class ViT(nn.Module):
    """Small pre-norm ViT classifier; see the module docstring for the layer names.

    Example::

        model = ViT(ViTConfig(width=64, depth=4, n_classes=20))
        logits = model(torch.rand(8, 28, 28))      # (8, 20)
    """

    def __init__(self, config: ViTConfig | None = None, **overrides):
        super().__init__()
        cfg = config or ViTConfig()
        if overrides:
            cfg = ViTConfig(**{**cfg.to_dict(), **overrides})
        self.config = cfg
        self.patch_embed = nn.Linear(cfg.patch * cfg.patch * cfg.channels, cfg.width)
        self.cls_token = nn.Embedding(1, cfg.width)
        self.pos_embed = nn.Embedding(cfg.n_patches + 1, cfg.width)
        self.blocks = nn.ModuleList(Block(cfg.width, cfg.heads, cfg.mlp_ratio) for _ in range(cfg.depth))
        self.ln_final = nn.LayerNorm(cfg.width)
        self.head = nn.Linear(cfg.width, cfg.n_classes)
        self.register_buffer("_positions", torch.arange(cfg.n_patches + 1), persistent=False)
        self.register_buffer("_cls_index", torch.zeros(1, dtype=torch.long), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Truncated-normal(0.02) weights, zero biases, unit LayerNorm gains (the usual ViT init)."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.trunc_normal_(m.weight, std=0.02)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        # residual branches start small (GPT-2 style scaling by depth)
        for b in self.blocks:
            assert isinstance(b, Block)
            for lin in (b.attn.out, b.mlp.fc2):
                lin.weight.data.mul_(1.0 / math.sqrt(2 * len(self.blocks)))

    def patchify(self, x: torch.Tensor) -> torch.Tensor:
        """``(n, [C,] H, W)`` images -> ``(n, n_patches, patch*patch*C)`` rows, row-major patch order."""
        cfg = self.config
        if x.dim() == 3:
            x = x.unsqueeze(1)
        if x.dim() != 4 or x.shape[1] != cfg.channels or x.shape[2] != cfg.image_size or x.shape[3] != cfg.image_size:
            raise ValueError(
                f"images of shape {tuple(x.shape)} are out of range: must be (n, {cfg.channels}, "
                f"{cfg.image_size}, {cfg.image_size}) or (n, {cfg.image_size}, {cfg.image_size}) for channels=1"
            )
        n, c, p = x.shape[0], cfg.channels, cfg.patch
        g = cfg.image_size // p
        x = x.reshape(n, c, g, p, g, p).permute(0, 2, 4, 1, 3, 5)
        return x.reshape(n, g * g, c * p * p)

    def tokens(self, x: torch.Tensor) -> torch.Tensor:
        """Residual stream after the last block, ``(n, 1 + n_patches, width)`` (class token first)."""
        z = self.patch_embed(self.patchify(x))
        cls = self.cls_token(self._cls_index).unsqueeze(0).expand(z.shape[0], -1, -1)
        z = torch.cat([cls, z], dim=1) + self.pos_embed(self._positions).unsqueeze(0)
        for blk in self.blocks:
            z = blk(z)
        return z

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Normalized class-token features ``(n, width)`` (the input of ``head``)."""
        return self.ln_final(self.tokens(x)[:, 0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))
