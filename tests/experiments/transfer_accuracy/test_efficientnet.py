"""EfficientNet-Lite in plain torch: TF 'SAME' padding, the Lite block rules, and agreement with the packaged code."""

import math

import pytest
import torch
import torch.nn.functional as F

from ftlab.models.efficientnet import LITE_PARAMS, EfficientNetLite, SamePad2d, block_args, stage_of_blocks


@pytest.mark.parametrize("n", [7, 8, 15, 16, 32, 33])
@pytest.mark.parametrize("k,s", [(3, 1), (3, 2), (5, 1), (5, 2)])
def test_same_padding_gives_ceil_output_and_pads_the_end_more(n, k, s):
    pad = SamePad2d(k, s)
    x = torch.randn(1, 1, n, n)
    y = F.conv2d(pad(x), torch.ones(1, 1, k, k), stride=s)
    assert y.shape[-1] == math.ceil(n / s) and y.shape[-2] == math.ceil(n / s)
    left, right, top, bottom = pad.pads(n, n)
    assert right - left in (0, 1) and bottom - top in (0, 1)


def test_lite_block_rules():
    depth = {v: len(block_args(v)) for v in LITE_PARAMS}
    assert depth == {"lite0": 16, "lite1": 21, "lite2": 21}
    # Lite0 -> Lite1 changes depth only; Lite1 -> Lite2 width only
    w = {v: sorted({b.c_out for b in block_args(v)}) for v in LITE_PARAMS}
    assert w["lite0"] == w["lite1"] == [16, 24, 40, 80, 112, 192, 320]
    assert w["lite2"] == [16, 24, 48, 88, 120, 208, 352]
    assert [stage_of_blocks("lite1").count(s) for s in range(7)] == [1, 3, 3, 4, 4, 5, 1]
    assert [stage_of_blocks("lite2").count(s) for s in range(7)] == [1, 3, 3, 4, 4, 5, 1]
    for v in LITE_PARAMS:
        args = block_args(v)
        assert args[0].c_in == 32 and all(a.c_in == b.c_out for a, b in zip(args[1:], args[:-1]))


def test_parameter_names_and_counts_match_the_checkpoints():
    m = EfficientNetLite("lite0")
    names = [k for k in m.state_dict()]
    assert names[0] == "_conv_stem.weight" and "_blocks.0._depthwise_conv.weight" in names
    assert "_blocks.0._expand_conv.weight" not in names and "_blocks.1._expand_conv.weight" in names
    assert names[-2:] == ["_fc.weight", "_fc.bias"]
    assert sum(p.numel() for p in m.parameters()) == 4652008  # the published Lite0 size (4.7M)
    assert sum(p.numel() for p in EfficientNetLite("lite2").parameters()) == 6092072


def test_features_are_pooled_head_activations_and_bounded_by_relu6():
    m = EfficientNetLite("lite0", num_classes=None).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        f = m(x)
        fm = m.feature_map(x)
    assert f.shape == (2, 1280) and fm.shape == (2, 1280, 1, 1)
    assert float(f.min()) >= 0 and float(f.max()) <= 6


def test_agrees_with_the_packaged_implementation():
    ref_mod = pytest.importorskip("efficientnet_lite_pytorch")
    for v in ("lite0", "lite2"):
        torch.manual_seed(0)
        ref = ref_mod.EfficientNet.from_name(f"efficientnet-{v}").eval()
        with torch.no_grad():
            for p in ref.parameters():
                p.normal_(0, 0.1)
            for mod in ref.modules():
                if isinstance(mod, torch.nn.BatchNorm2d):
                    mod.running_mean.normal_(0, 0.1)
                    mod.running_var.uniform_(0.5, 1.5)
        m = EfficientNetLite(v).eval()
        m.load_state_dict(ref.state_dict(), strict=True)
        r = LITE_PARAMS[v][2]
        x = torch.randn(1, 3, r, r)
        with torch.no_grad():
            torch.testing.assert_close(m(x), ref(x), rtol=1e-4, atol=1e-4)
