"""TransFusion: planted permutations (heads, units inside heads, residual stream, MLP units) recovered exactly."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ftlab.experiments.transfer_accuracy.family import permuted_copy
from ftlab.models.vit import ViT, ViTConfig
from ftlab.transfer import TaskVector, fit_transfer, get_method, transfer
from ftlab.transfer.methods import method_info
from ftlab.transfer.methods.transfusion import PermutationSpec, infer_permutation_spec, match_weights


def _vit(seed: int = 0, **changes) -> ViT:
    torch.manual_seed(seed)
    shape = {"width": 16, "depth": 2, "heads": 4, "mlp_ratio": 2} | changes
    m = ViT(ViTConfig(image_size=8, patch=4, channels=1, n_classes=3, **shape))
    with torch.no_grad():  # trained-looking weights: LayerNorm gains and biases away from 1 and 0
        for p in m.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return m.eval()


def _finetuned(model: nn.Module, seed: int = 1) -> nn.Module:
    ft = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in ft.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return ft


def test_permuted_vit_copy_is_recovered_exactly():
    a = _vit()
    a_ft = _finetuned(a)
    b = permuted_copy(a, seed=7)                 # heads, q/k and v dims inside heads, residual, MLP units renamed
    b_ft_expected = permuted_copy(a_ft, seed=7)  # the same renaming of the fine-tuned model
    method = get_method("transfusion").bind(a, b)
    res = fit_transfer(a, a_ft, b, method=method)
    expected = TaskVector.from_models(b, b_ft_expected)
    assert set(res.task_vector) == set(expected)
    for k in expected:
        assert torch.equal(res.task_vector[k], expected[k]), k   # a permutation: bit-exact
    x = torch.randn(5, 1, 8, 8)
    with torch.no_grad():
        assert torch.allclose(res.task_vector.apply(b, 1.0)(x), a_ft(x), atol=1e-5)
    assert res.fits == {}


def test_recovery_survives_small_independent_noise_on_the_target():
    a = _vit(3)
    b = permuted_copy(a, seed=11)
    truth, _ = match_weights(infer_permutation_spec(a), dict(a.named_parameters()), dict(b.named_parameters()))
    noisy = copy.deepcopy(b)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in noisy.parameters():
            p.add_(0.05 * p.abs().mean() * torch.randn(p.shape, generator=g))
    found, sweeps = match_weights(infer_permutation_spec(a), dict(a.named_parameters()),
                                  dict(noisy.named_parameters()))
    assert sweeps >= 1
    for s in truth:
        assert torch.equal(found[s], truth[s]), s
    # the planted permutation is what was found: A's weights gathered by it give B's exactly
    for name, p in a.named_parameters():
        from ftlab.transfer.methods.transfusion import permute

        assert torch.equal(permute(p.detach(), infer_permutation_spec(a).axes[name], truth), dict(
            b.named_parameters())[name].detach()), name


def test_heads_are_matched_as_wholes():
    a = _vit(4)
    spec = infer_permutation_spec(a)
    b = permuted_copy(a, seed=2)
    perms, _ = match_weights(spec, dict(a.named_parameters()), dict(b.named_parameters()))
    dh = 16 // 4
    for i in range(2):
        qk, v = perms[f"b{i}.qk"].reshape(4, dh), perms[f"b{i}.v"].reshape(4, dh)
        heads_qk = [set((row // dh).tolist()) for row in qk]
        assert all(len(h) == 1 for h in heads_qk)                        # every B head reads exactly one A head
        assert heads_qk == [set((row // dh).tolist()) for row in v]      # q/k and v move with the same head
        assert sorted(min(h) for h in heads_qk) == [0, 1, 2, 3]          # a permutation of heads


def test_sequential_mlp_with_norm_is_recovered():
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(6, 12), nn.LayerNorm(12), nn.ReLU(), nn.Linear(12, 9), nn.Tanh(), nn.Linear(9, 2))
    with torch.no_grad():
        for p in a.parameters():
            p.add_(0.2 * torch.randn_like(p))
    p1, p2 = torch.randperm(12), torch.randperm(9)
    b = copy.deepcopy(a)
    with torch.no_grad():
        b[0].weight.copy_(a[0].weight[p1])
        b[0].bias.copy_(a[0].bias[p1])
        b[1].weight.copy_(a[1].weight[p1])
        b[1].bias.copy_(a[1].bias[p1])
        b[3].weight.copy_(a[3].weight[p2][:, p1])
        b[3].bias.copy_(a[3].bias[p2])
        b[5].weight.copy_(a[5].weight[:, p2])
    a_ft = _finetuned(a)
    res = fit_transfer(a, a_ft, b, method=get_method("transfusion").bind(a, b))
    x = torch.randn(7, 6)
    with torch.no_grad():
        assert torch.allclose(res.task_vector.apply(b, 1.0)(x), a_ft(x), atol=1e-6)


def test_transfusion_goes_through_the_same_door_as_every_method():
    """No binding by the caller: fit_transfer and transfer hand the method both bases, as it declares
    (calibration="bases"); a method bound ahead gives the same permutation."""
    a = _vit()
    a_ft = _finetuned(a)
    b = permuted_copy(a, seed=7)
    expected = TaskVector.from_models(b, permuted_copy(a_ft, seed=7))
    assert get_method("transfusion").calibration == "bases"
    for tv in (fit_transfer(a, a_ft, b, method="transfusion").task_vector,
               transfer(a, a_ft, b, method="transfusion", max_iter=50),
               fit_transfer(a, a_ft, b, method=get_method("transfusion").bind(a, b)).task_vector):
        assert set(tv) == set(expected) and all(torch.equal(tv[k], expected[k]) for k in expected)


def test_unequal_and_unknown_models_are_refused():
    wide = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    narrow = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    with pytest.raises(ValueError, match="equal"):
        fit_transfer(narrow, _finetuned(narrow), wide, method="transfusion")

    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(3, 3))

    with pytest.raises(ValueError, match="Odd"):
        get_method("transfusion").bind(Odd(), Odd())
    with pytest.raises(ValueError, match="cannot be split"):
        PermutationSpec({"w": ("s", None)}, {"s": ("g", 2)}).sizes({"w": torch.zeros(3, 3)})
    assert "2505.22697" in method_info("transfusion").reference


@pytest.mark.parametrize("source, target, named", [
    ({}, {"heads": 2}, "space 'b0.qk' is split into 4 heads in the source and 2 in the target"),  # equal shapes
    ({}, {"depth": 3}, "the source has no 'blocks.2."),
    ({"depth": 3}, {}, "the target has no 'blocks.2."),
    ({}, {"mlp_ratio": 4}, "space 'b0.mlp' (axis 0 of 'blocks.0.mlp.fc1.weight') has 64 coordinates in the target "
                           "and 32"),
    ({}, {"width": 24}, "space 'res' (axis 0 of 'patch_embed.weight') has 24 coordinates in the target and 16"),
])
def test_unequal_vits_are_refused_in_one_line_naming_the_mismatch(source, target, named):
    """Every architecture difference is refused when the method is bound, before any matching, even one (a
    different head count) under which every parameter keeps its shape."""
    with pytest.raises(ValueError) as err:
        get_method("transfusion").bind(_vit(0, **source), _vit(1, **target))
    msg = str(err.value)
    assert named in msg and "\n" not in msg and msg.startswith("transfusion needs equal architectures, but "), msg


def test_unequal_stacks_are_refused_naming_the_space():
    narrow = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    wide = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with pytest.raises(ValueError, match=r"space 'h0' \(axis 0 of '0.weight'\) has 8 coordinates in the target and 6 "
                                         "in the source"):
        get_method("transfusion").bind(narrow, wide)
    other_input = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 2))  # an axis in no space
    with pytest.raises(ValueError, match=r"'0.weight' is \(6, 5\) in the target and \(6, 4\) in the source"):
        get_method("transfusion").bind(narrow, other_input)
