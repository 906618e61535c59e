"""Capture points record what autograd would compute; hooks always clean up."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ftlab.core.hooks import activations, capture, capture_points, hook_count
from ftlab.models.resnet import resnet18

torch.set_num_threads(1)


def test_linear_weight_gradient_equals_sum_of_outer_products():
    """dL/dW = sum_n g_n x_n^T: captured output gradients and inputs rebuild the weight gradient."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    x = torch.randn(4, 6, 5)
    with capture(model) as cap:
        loss = model(x).pow(2).sum()
        cap.backward(loss)
    assert all(p.grad is None for p in model.parameters())  # capture never touches .grad
    model(x).pow(2).sum().backward()
    for name in ("0", "2"):
        X = cap.inputs[name][0].reshape(-1, cap.inputs[name][0].shape[-1])
        G = cap.output_grads[name][0].reshape(-1, cap.output_grads[name][0].shape[-1])
        torch.testing.assert_close(G.T @ X, model.get_submodule(name).weight.grad, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(G.sum(0), model.get_submodule(name).bias.grad, rtol=1e-5, atol=1e-5)


def rows(cap, model, side):
    """The rows of the root module's captured input (``side="in"``) or output gradient, as its layer kind forms them."""
    from ftlab.transfer.spec import infer_spec

    point = infer_spec(model).points[""]
    t = (cap.inputs if side == "in" else cap.output_grads)[""][0]
    return point.layer_kind.rows(t, point, side)


def test_conv_gradient_from_unfolded_patches():
    torch.manual_seed(1)
    conv = nn.Conv2d(3, 4, 3, padding=1, stride=2).double()
    x = torch.randn(2, 3, 7, 7, dtype=torch.float64)
    with capture(conv) as cap:
        cap.backward(conv(x).sin().sum())
    X, grid = rows(cap, conv, "in")
    G, grid_out = rows(cap, conv, "out")
    assert grid == grid_out == (4, 4)
    conv(x).sin().sum().backward()
    dW = G.reshape(-1, 4).T @ X.reshape(-1, 27)
    torch.testing.assert_close(dW, conv.weight.grad.reshape(4, -1))
    # padding="same" is turned into the equivalent explicit padding
    same = nn.Conv2d(3, 4, 3, padding="same", dilation=2).double()
    with capture(same) as cap:
        cap.backward(same(x).sin().sum())
    X, _ = rows(cap, same, "in")
    G, _ = rows(cap, same, "out")
    same(x).sin().sum().backward()
    torch.testing.assert_close(G.reshape(-1, 4).T @ X.reshape(-1, 27), same.weight.grad.reshape(4, -1))


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_decomposition_is_exact(batch_first):
    torch.manual_seed(2)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=batch_first).double()
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    if not batch_first:
        x = x.transpose(0, 1)
    kpm = torch.zeros(3, 5, dtype=torch.bool)
    kpm[0, 3:] = True
    ref = layer(x, src_key_padding_mask=kpm)
    with capture(layer) as cap:
        out = layer(x, src_key_padding_mask=kpm)
        cap.backward(out.pow(2).sum())
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    assert sorted(cap.outputs) == sorted(["self_attn.q", "self_attn.k", "self_attn.v", "self_attn.out_proj",
                                          "linear1", "linear2", "norm1", "norm2"])
    layer(x, src_key_padding_mask=kpm).pow(2).sum().backward()
    w_grad = layer.self_attn.in_proj_weight.grad.chunk(3)
    for i, part in enumerate("qkv"):
        X = cap.inputs[f"self_attn.{part}"][0].reshape(-1, 8)
        G = cap.output_grads[f"self_attn.{part}"][0].reshape(-1, 8)
        torch.testing.assert_close(G.T @ X, w_grad[i], rtol=1e-9, atol=1e-9)
    assert hook_count(layer) == 0
    torch.testing.assert_close(layer(x, src_key_padding_mask=kpm), ref)


def test_attention_with_float_mask_and_weights():
    torch.manual_seed(3)
    mha = nn.MultiheadAttention(8, 4, batch_first=True).double()
    q, kv = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(2, 5, 8, dtype=torch.float64)
    mask = torch.randn(3, 5, dtype=torch.float64)
    ref = mha(q, kv, kv, attn_mask=mask, average_attn_weights=False)
    with capture(mha):
        got = mha(q, kv, kv, attn_mask=mask, average_attn_weights=False)
    for r, g in zip(ref, got):
        torch.testing.assert_close(g, r, rtol=0, atol=1e-12)


def test_quiet_attention_computes_as_when_captured_and_records_nothing():
    """A quiet nn.MultiheadAttention runs the decomposed forward (bit for bit the captured computation, which in float32
    differs from torch's own fused one) and records none of its points; its forward is restored afterwards."""
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(8, 8), nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True))
    x = torch.randn(3, 6, 8)
    with capture(model, ["0", "1.self_attn"]) as cap:
        recorded = model(x)
    with capture(model, ["0"], quiet=["1.self_attn", "1.linear1"]) as cap_q:
        quiet = model(x)
    assert torch.equal(quiet, recorded) and "1.self_attn.q" in cap.outputs
    assert set(cap_q.outputs) == {"0"} and hook_count(model) == 0
    assert "forward" not in model[1].self_attn.__dict__


def test_hooks_removed_even_when_the_loss_raises():
    model = nn.Sequential(nn.Linear(3, 4), nn.TransformerEncoderLayer(4, 2, 8, batch_first=True))
    before = model[1].self_attn.forward
    with pytest.raises(RuntimeError, match="boom"):
        with capture(model):
            model(torch.randn(2, 5, 3))
            raise RuntimeError("boom")
    assert hook_count(model) == 0
    assert "forward" not in model[1].self_attn.__dict__ and model[1].self_attn.forward == before


def test_selection_filters():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2), nn.LayerNorm(2))
    assert capture_points(model) == ["0", "2", "3"]
    assert capture_points(model, "[02]") == ["0", "2"]
    assert capture_points(model, ["2"]) == ["2"]
    assert capture_points(model, lambda n, m: isinstance(m, nn.ReLU)) == ["1"]
    with pytest.raises(ValueError, match="not modules"):
        capture_points(model, ["7"])


def test_inplace_modification_is_an_error():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(inplace=True), nn.Linear(4, 1))
    with capture(model, ["0"]) as cap, pytest.raises(ValueError, match="in place"):
        cap.backward(model(torch.randn(2, 3)).sum())


def test_unused_outputs_get_zero_gradients_and_input_grads():
    lin1, lin2 = nn.Linear(3, 3), nn.Linear(3, 3)
    model = nn.ModuleDict({"a": lin1, "b": lin2})
    x = torch.randn(4, 3, requires_grad=True)
    with capture(model) as cap:
        y = lin1(x)
        lin2(x)  # recorded but unused by the loss
        cap.backward(F.softplus(y).sum(), input_grads=True)
    assert float(cap.output_grads["b"][0].abs().max()) == 0.0
    torch.testing.assert_close(cap.input_grads["a"][0], torch.sigmoid(y.detach()) @ lin1.weight.detach())


def test_capture_removes_hooks_even_after_an_error():
    net = resnet18(width=2, in_channels=1, num_classes=2, seed=0)
    with pytest.raises(RuntimeError), capture(net, ["stem"]):
        net(torch.randn(2, 5))  # wrong input rank
    assert hook_count(net) == 0
    with pytest.raises(ValueError, match="not modules"):
        with capture(net, ["nope"]):
            pass


def test_activations_are_the_module_outputs_and_restore_the_training_flag():
    net = resnet18(width=2, in_channels=1, num_classes=3, seed=0).train()
    X = torch.randn(7, 1, 8, 8)
    acts = activations(net, X, ["pool", "fc"], batch_size=3)
    net.eval()
    with torch.no_grad():
        logits = net(X)
    assert acts["fc"].shape == (7, 3) and acts["fc"].dtype.name == "float64"
    torch.testing.assert_close(torch.from_numpy(acts["fc"]).float(), logits, rtol=1e-5, atol=1e-6)
    net.train()
    activations(net, X, ["fc"])
    assert net.training and hook_count(net) == 0


class BareProj(nn.Module):
    """OpenCLIP-style: a LayerNorm then a bare projection parameter ``x @ proj`` (no module around it)."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(6)
        self.proj = nn.Parameter(torch.randn(6, 4))
        self.other = nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        e = self.ln(x) @ self.proj
        return F.linear(e, self.other)  # the other parameter is not used as x @ P


def test_bare_projection_parameters_are_captured_where_they_are_multiplied():
    """dL/dP = X^T G for x @ P: the captured input and output gradient rebuild the parameter's gradient."""
    from ftlab.core.hooks import param_uses

    torch.manual_seed(3)
    model = BareProj()
    x = torch.randn(5, 3, 6)
    with capture(model, ["ln"], params=["proj", "other"]) as cap:
        loss = model(x).pow(2).sum()
        cap.backward(loss)
        assert param_uses(cap, "proj") == 1 and param_uses(cap, "other") == 0  # F.linear is not x @ P
    assert hook_count(model) == 0
    model(x).pow(2).sum().backward()
    X = cap.inputs["proj"][0].reshape(-1, 6)
    G = cap.output_grads["proj"][0].reshape(-1, 4)
    torch.testing.assert_close(X.T @ G, model.proj.grad, rtol=1e-5, atol=1e-5)
    assert cap.inputs["proj"][0] is cap.outputs["ln"][0]  # the projection's input is the LayerNorm output itself
    with pytest.raises(ValueError, match="2-D"):
        with capture(model, params=["ln.weight"]):
            pass
    with pytest.raises(ValueError, match="not a parameter"):
        with capture(model, params=["nope"]):
            pass
