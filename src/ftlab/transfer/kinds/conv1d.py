"""``nn.Conv1d``: a convolution over one axis (sequences, audio frames), kind ``conv1d``.

A kernel ``(c_out, c_in / g, k)`` maps an input patch of ``c_in * k`` values to ``c_out`` channels, as a
2-D kernel does with ``c_in * k * k``: rows are unfolded patches on the input side and one row per output
position on the output side, ``weight`` is ``R_out^T tau R_in`` on the ``out x in*k`` matrix, grouped
kernels are carried densely and projected back onto B's groups, the output is affine in the input, and
an ungrouped kernel takes a PEFT LoRA (``lora_A`` a convolution with the kernel, ``lora_B`` a width-1
one): :class:`~ftlab.transfer.kinds.conv.ConvKind` over one axis, with its own unfolding. A depthwise 1-D
convolution is carried as a grouped one (exact for channel permutations, and its kernel stays depthwise).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ftlab.transfer.kinds.base import register_kind
from ftlab.transfer.kinds.conv import ConvKind

__all__ = ["Conv1dKind"]


class Conv1dKind(ConvKind):
    name = "conv1d"
    module_type = nn.Conv1d
    spatial = 1
    axes = "(B, C, L)"

    def matches(self, module: nn.Module) -> bool:
        return isinstance(module, nn.Conv1d)

    def unfold(self, t: torch.Tensor, conv: tuple) -> tuple[torch.Tensor, None]:
        """Input patches ``(B, L_out, C * k)`` of a ``(B, C, L)`` tensor (as a 2-D unfold over ``(L, 1)``); no grid."""
        (k,), (s,), (p,), (d,) = conv
        cols = F.unfold(t.unsqueeze(-1), (k, 1), dilation=(d, 1), padding=(p, 0), stride=(s, 1))  # (B, C*k, L_out)
        return cols.transpose(1, 2), None


register_kind(Conv1dKind())
