"""The ``conv1d`` layer kind (``nn.Conv1d``, one module in ftlab.transfer.kinds): a permuted copy of a 1-D
convolutional network -- a dense, a grouped and a depthwise convolution -- is recovered exactly, a model
transferred to itself returns its task vector, and a LoRA of a Conv1d reads as PEFT merges it and writes
what PEFT loads."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ftlab.transfer import TaskVector, fit_transfer, infer_spec
from ftlab.transfer.lora import read_lora, write_lora
from transfer_helpers import perturbed

DT = torch.float64
pytestmark = pytest.mark.filterwarnings("ignore::ftlab.transfer.align.RankWarning")


class Seq1d(nn.Module):
    """Sequences ``(B, 3, L)``: dense, grouped (2 groups) and depthwise 1-D convolutions, then a linear head."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv1d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv1d(8, 8, 3, padding=2, dilation=2, groups=2)
        self.dw = nn.Conv1d(8, 8, 5, padding="same", groups=8)
        self.conv3 = nn.Conv1d(8, 6, 1, stride=2)
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        h = torch.tanh(self.dw(torch.tanh(self.conv2(torch.tanh(self.conv1(x))))))
        return self.fc(torch.tanh(self.conv3(h)).mean(2))


def _grouped_perm(g: torch.Generator) -> torch.Tensor:
    """8 channels in 2 groups of 4: the groups swapped, the channels shuffled inside (the grouping is kept)."""
    inner = torch.randperm(4, generator=g)
    return torch.cat([4 + inner, inner])


def _permuted(state: dict, p1: torch.Tensor, p2: torch.Tensor, p3: torch.Tensor) -> dict:
    """``state`` of :class:`Seq1d` with channel spaces renamed by ``p1`` (conv1 out), ``p2`` (conv2 and dw out), ``p3``
    (conv3 out): the same function. A grouped kernel's input axis is local to its group: permuted in dense form."""
    out = dict(state)
    out["conv1.weight"], out["conv1.bias"] = state["conv1.weight"][p1], state["conv1.bias"][p1]
    dense = torch.zeros(8, 8, 3, dtype=state["conv2.weight"].dtype)
    for grp in range(2):
        dense[4 * grp:4 * grp + 4, 4 * grp:4 * grp + 4] = state["conv2.weight"][4 * grp:4 * grp + 4]
    dense = dense[p2][:, p1]
    out["conv2.weight"], out["conv2.bias"] = torch.cat([dense[:4, :4], dense[4:, 4:]]), state["conv2.bias"][p2]
    out["dw.weight"], out["dw.bias"] = state["dw.weight"][p2], state["dw.bias"][p2]
    out["conv3.weight"], out["conv3.bias"] = state["conv3.weight"][p3][:, p2], state["conv3.bias"][p3]
    out["fc.weight"] = state["fc.weight"][:, p3]
    return out


def _ce(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1])


def _batches(n: int = 3):
    g = torch.Generator().manual_seed(2)
    return [(torch.randn(16, 3, 11, generator=g, dtype=DT), torch.randint(0, 3, (16,), generator=g)) for _ in range(n)]


def test_the_spec_of_a_conv1d_reads_patches_and_keeps_groups():
    spec = infer_spec(Seq1d())
    pts = spec.points
    assert (pts["conv1"].kind, pts["conv1"].in_dim, pts["conv1"].out_dim) == ("conv1d", 3 * 3, 8)
    assert (pts["conv2"].in_dim, pts["conv2"].groups) == (8 * 3, 2)  # a grouped kernel reads the dense patch
    assert pts["dw"].conv == ((5,), (1,), (2,), (1,))  # padding="same" made explicit
    assert [r.kind for r in spec.rules["conv1.weight"]] == ["weight"]
    with pytest.raises(ValueError, match="padding_mode='circular'"):
        infer_spec(nn.Sequential(nn.Conv1d(2, 2, 3, padding=1, padding_mode="circular")))


def test_a_permuted_conv1d_copy_is_recovered_exactly():
    g = torch.Generator().manual_seed(5)
    torch.manual_seed(5)
    A = Seq1d().double()
    p1, p2, p3 = _grouped_perm(g), _grouped_perm(g), torch.randperm(6, generator=g)
    B = Seq1d().double()
    B.load_state_dict(_permuted(A.state_dict(), p1, p2, p3))
    x = _batches(1)[0][0]
    torch.testing.assert_close(B(x), A(x))  # B computes A's function
    A_ft = perturbed(A)
    truth = _permuted(dict(TaskVector.from_models(A, A_ft).items()), p1, p2, p3)
    res = fit_transfer(A, A_ft, B, _batches(), _ce)
    tv = res.task_vector
    err = TaskVector({k: tv[k] - truth[k] for k in truth}).norm() / TaskVector(truth).norm()
    assert err < 1e-8
    assert tv["conv2.weight"].shape == (8, 4, 3) and tv["dw.weight"].shape == (8, 1, 5)
    # the maps are the permutations themselves (input side: the channel permutation on each patch position)
    P = torch.zeros(8, 8, dtype=DT)
    P[p1, torch.arange(8)] = 1.0
    torch.testing.assert_close(res.fits["conv1"][1].R, P, atol=1e-9, rtol=0)


def test_a_conv1d_network_transferred_to_itself_returns_its_task_vector():
    torch.manual_seed(1)
    A = Seq1d().double()
    A_ft = perturbed(A, 4)
    tau = TaskVector.from_models(A, A_ft)
    b = _batches(1)[0]
    tv = fit_transfer(A, A_ft, copy.deepcopy(A), [(b[0][:2], b[1][:2])], _ce).task_vector  # 2 samples: most maps completed
    assert TaskVector({k: tv[k] - tau[k] for k in tv}).norm() < 1e-8 * tau.norm()


def test_a_conv1d_lora_reads_as_peft_merges_it_and_is_written_as_peft_loads_it(tmp_path):
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    base = Seq1d()
    pm = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(r=2, lora_alpha=4, target_modules=["conv1", "conv3"]))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    pm.save_pretrained(str(tmp_path / "in"))
    merged = copy.deepcopy(pm).merge_and_unload().state_dict()
    got = read_lora(tmp_path / "in", base).task_vector
    for k in ("conv1.weight", "conv3.weight"):
        torch.testing.assert_close(got[k].float(), merged[k] - base.state_dict()[k], atol=1e-6, rtol=0)
    # out: the delta factored at its rank, loadable by PEFT, which merges it back to the same weights
    tau = TaskVector({k: got[k] for k in ("conv1.weight", "conv3.weight")})
    (tmp_path / "out").mkdir()
    report = write_lora(tmp_path / "out", tau, base)
    assert report["modules"]["conv1"] == {"kind": "conv", "rank": 2, "truncation_error": pytest.approx(0, abs=1e-6)}
    loaded = peft.PeftModel.from_pretrained(copy.deepcopy(base), str(tmp_path / "out")).merge_and_unload().state_dict()
    for k in ("conv1.weight", "conv3.weight"):
        torch.testing.assert_close(loaded[k], merged[k], atol=1e-5, rtol=0)
