"""The plain-torch ViT: shapes, patch embedding = strided convolution, config validation."""

import pytest
import torch
import torch.nn.functional as F

from ftlab.models.vit import ViT, ViTConfig


def test_forward_shapes_and_features():
    torch.manual_seed(0)
    m = ViT(ViTConfig(image_size=12, patch=4, width=16, depth=2, heads=4, n_classes=5))
    x = torch.randn(3, 12, 12)
    assert m(x).shape == (3, 5)
    assert m.tokens(x).shape == (3, 1 + 9, 16)
    f = m.features(x)
    assert f.shape == (3, 16)
    # the logits are the head applied to the features
    torch.testing.assert_close(m(x), m.head(f))


def test_patch_embedding_equals_strided_convolution():
    torch.manual_seed(1)
    cfg = ViTConfig(image_size=12, patch=4, channels=2, width=8, depth=1, heads=2)
    m = ViT(cfg)
    x = torch.randn(2, 2, 12, 12)
    via_linear = m.patch_embed(m.patchify(x))
    kernel = m.patch_embed.weight.view(8, 2, 4, 4)
    via_conv = F.conv2d(x, kernel, m.patch_embed.bias, stride=4).flatten(2).transpose(1, 2)
    torch.testing.assert_close(via_linear, via_conv, rtol=1e-5, atol=1e-5)


def test_attention_is_permutation_equivariant_over_patches():
    # without positional embeddings and the class token, blocks commute with token permutations
    torch.manual_seed(2)
    m = ViT(ViTConfig(image_size=8, patch=4, width=8, depth=2, heads=2))
    z = torch.randn(2, 5, 8)
    perm = torch.tensor([0, 3, 1, 4, 2])
    out = z
    out_p = z[:, perm]
    for blk in m.blocks:
        out, out_p = blk(out), blk(out_p)
    torch.testing.assert_close(out[:, perm], out_p, rtol=1e-5, atol=1e-5)


def test_modules_are_standard_layers_and_depth_stack():
    m = ViT(width=8, depth=3, heads=2)
    kinds = {type(mod) for mod in m.modules()}
    assert {torch.nn.Linear, torch.nn.LayerNorm, torch.nn.Embedding} <= kinds
    assert len(m.blocks) == 3 and isinstance(m.blocks, torch.nn.ModuleList)


@pytest.mark.parametrize("kw", [dict(patch=5), dict(width=10, heads=4), dict(depth=0)])
def test_bad_config_raises(kw):
    with pytest.raises(ValueError, match=next(iter(kw)) if "heads" not in kw else "heads"):
        ViTConfig(**kw)


def test_bad_image_shape_raises():
    m = ViT(width=8, depth=1, heads=2)
    with pytest.raises(ValueError, match="images of shape"):
        m(torch.zeros(2, 27, 27))
