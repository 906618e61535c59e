"""Layer types and options of issue 14: stage-aware depth maps, vocabulary and name maps, grouped
convolutions, bare projections, the memory check, and ranks judged at the precision of the sums."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ftlab.core.stats import CrossMoments
from ftlab.transfer import TaskVector, TransferOptions, fit_transfer, infer_spec, transfer
from ftlab.transfer.align import fit_map
from ftlab.transfer.layer_map import build_layer_map, depth_map, stage_depth_map, stage_ids
from transfer_helpers import perturbed

torch.set_num_threads(1)
DT = torch.float64
pytestmark = pytest.mark.filterwarnings("ignore::ftlab.transfer.align.RankWarning")


def ce(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


# -- stage-aware depth maps ---------------------------------------------------------------------------

class Block(nn.Module):
    """A residual block that may stride and widen (the first block of a stage)."""

    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1)
        self.bn = nn.BatchNorm2d(c_out)
        self.res = c_in == c_out and stride == 1

    def forward(self, x):
        h = F.relu(self.bn(self.conv(x)))
        return h + x if self.res else h


class Staged(nn.Module):
    """A flat stack of blocks in stages (EfficientNet's ``_blocks``): ``stages`` = blocks per stage."""

    def __init__(self, stages, widths=(4, 6, 8)):
        super().__init__()
        self.stem = nn.Conv2d(3, widths[0], 3, padding=1)
        blocks, c = [], widths[0]
        for s, n in enumerate(stages):
            for i in range(n):
                stride = 2 if (i == 0 and s > 0) else 1
                blocks.append(Block(c, widths[s], stride))
                c = widths[s]
        self.blocks = nn.ModuleList(blocks)
        self.fc = nn.Linear(c, 3)

    def forward(self, x):
        h = self.stem(x)
        for b in self.blocks:
            h = b(h)
        return self.fc(h.mean((2, 3)))


def test_stage_relative_pairs_blocks_within_stages():
    assert stage_ids([(4, 6, 6), (6, 3, 3), (6, 3, 3), (8, 2, 2)]) == [0, 1, 1, 2]
    torch.manual_seed(0)
    A, B = Staged((1, 2, 3)).double().eval(), Staged((1, 4, 2)).double().eval()
    batches = [(torch.randn(4, 3, 8, 8, dtype=DT), torch.randint(0, 3, (4,)))]
    res = fit_transfer(A, perturbed(A), B, batches, ce, method="naive")
    # stage 1 (width 6): B's transition block 1 <- A's 1, the rest <- A's 2; stage 2 (width 8): 5 <- 3, 6 <- 5
    assert res.layer_map["blocks"] == [0, 1, 2, 2, 2, 3, 5]
    assert res.layer_stages["blocks"] == [[0, 1, 1, 2, 2, 2], [0, 1, 1, 1, 1, 2, 2]]
    # the paper's rule over the whole stack pairs B's stage-1 blocks 3 and 4 with A's stride-2 block 3 of stage 2
    old = fit_transfer(A, perturbed(A), B, batches, ce, method="naive",
                       options=TransferOptions(depth_map="nearest_relative"))
    assert old.layer_map["blocks"] == [0, 1, 2, 3, 3, 4, 5]
    # without calibration data the stages come from each block's last parameter (its output width): same map
    static = build_layer_map(A, B, "stage_relative")
    assert static.as_dict()["blocks"] == [0, 1, 2, 2, 2, 3, 5]
    # BiCo over the stage-aware pairs: every pair has equal shapes, so the transfer runs and is finite
    tv = transfer(A, perturbed(A), B, batches, ce)
    assert all(torch.isfinite(v).all() for v in tv.values())
    # different numbers of stages: the stack falls back to the nearest relative depth, and the record says so
    fb = fit_transfer(A, perturbed(A), Staged((1, 3)).double(), batches, ce, method="naive")
    assert fb.layer_map["blocks"] == depth_map(6, 4, "nearest_relative")
    assert build_layer_map(A, Staged((1, 3)).double(), "stage_relative").describe()["fallback"] == {
        "blocks": "nearest_relative"}


def test_stage_depth_map_edge_cases():
    # one source block per stage: every target block of the stage takes it
    assert stage_depth_map([0, 1, 2], [0, 1, 1, 2, 2]) == [0, 1, 1, 2, 2]
    # no transition blocks (uniform stack): the nearest relative depth over the stage
    assert stage_depth_map([0] * 4, [0] * 7) == [0, 1, 1, 2, 2, 3, 3]
    with pytest.raises(ValueError, match="2 stages in the source but 3"):
        stage_depth_map([0, 1], [0, 1, 2], path="blocks")


class Inner(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return x + torch.tanh(self.fc(x))


class Stage(nn.Module):
    def __init__(self, d, n):
        super().__init__()
        self.blocks = nn.ModuleList(Inner(d) for _ in range(n))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


class Hier(nn.Module):
    """A hierarchical model: a stack of stages, each a stack of blocks (Swin's ``layers.i.blocks.j``)."""

    def __init__(self, per_stage, d=6):
        super().__init__()
        self.stages = nn.ModuleList(Stage(d, n) for n in per_stage)
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        for s in self.stages:
            x = s(x)
        return self.head(x)


def test_nested_stacks_are_mapped_inside_each_stage():
    torch.manual_seed(1)
    A, B = Hier((2, 3)).double(), Hier((3, 2)).double()
    lm = build_layer_map(A, B, "nearest_relative")
    assert lm.source_name("stages.0.blocks.2.fc.weight") == "stages.0.blocks.1.fc.weight"
    assert lm.source_name("stages.1.blocks.1.fc.bias") == "stages.1.blocks.2.fc.bias"
    assert lm.source_name("head.weight") == "head.weight"
    batches = [(torch.randn(16, 6, dtype=DT), torch.randint(0, 3, (16,)))]
    tv = transfer(A, perturbed(A), B, batches, ce)
    assert set(tv) == {k for k, _ in B.named_parameters()}


# -- vocabulary index maps and name maps ---------------------------------------------------------------

def tiny_bert(vocab):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=vocab, hidden_size=12, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=16, max_position_embeddings=16, num_labels=3)
    return transformers.BertForSequenceClassification(cfg).double().eval()


def hf_ce(model, batch):
    return F.cross_entropy(model(input_ids=batch["input_ids"]).logits, batch["labels"])


def test_vocab_map_carries_rows_of_a_shifted_vocabulary():
    """B's vocabulary is A's shifted by 4 (MPNet's ids are BERT's + 4): rows follow the index map exactly."""
    torch.manual_seed(2)
    A = tiny_bert(30)
    B = tiny_bert(34)
    state = {k: v.clone() for k, v in A.state_dict().items()}
    table = torch.randn(34, 12, dtype=DT) * 0.02
    table[4:] = state["bert.embeddings.word_embeddings.weight"]
    state["bert.embeddings.word_embeddings.weight"] = table
    B.load_state_dict(state)
    A_ft = perturbed(A)
    g = torch.Generator().manual_seed(3)
    src = [{"input_ids": torch.randint(1, 30, (8, 10), generator=g), "labels": torch.randint(0, 3, (8,), generator=g)}
           for _ in range(3)]
    tgt = [{"input_ids": b["input_ids"] + 4, "labels": b["labels"]} for b in src]
    vmap = [-1] * 4 + list(range(30))
    tau = TaskVector.from_models(A, A_ft)
    tv = transfer(A, A_ft, B, source_batches=src, target_batches=tgt, loss=hf_ce, vocab_map=vmap, zero_params=())
    w = "bert.embeddings.word_embeddings.weight"
    assert float(tv[w][:4].abs().max()) == 0  # rows with no source stay B's own
    torch.testing.assert_close(tv[w][4:], tau[w], atol=1e-8, rtol=0)
    for k in tau:
        if k != w:
            torch.testing.assert_close(tv[k], tau[k], atol=1e-8, rtol=0)
    with pytest.raises(ValueError, match="vocab_map"):
        transfer(A, A_ft, B, source_batches=src, target_batches=tgt, loss=hf_ce)
    with pytest.raises(ValueError, match="33 entries but no target embedding table has 33 rows"):
        transfer(A, A_ft, B, source_batches=src, target_batches=tgt, loss=hf_ce, vocab_map=[0] * 33)
    with pytest.raises(ValueError, match="outside"):
        transfer(A, A_ft, B, source_batches=src, target_batches=tgt, loss=hf_ce, vocab_map=[40] * 34)


class NamedA(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(5, 7), nn.Linear(7, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


class NamedB(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(5, 7), nn.Linear(7, 3)

    def forward(self, x):
        return self.second(torch.tanh(self.first(x)))


def test_name_map_pairs_differently_named_layers():
    torch.manual_seed(4)
    A = NamedA().double()
    perm = torch.randperm(7)
    B = NamedB().double()
    with torch.no_grad():
        B.first.weight.copy_(A.fc1.weight[perm])
        B.first.bias.copy_(A.fc1.bias[perm])
        B.second.weight.copy_(A.fc2.weight[:, perm])
        B.second.bias.copy_(A.fc2.bias)
    A_ft = perturbed(A)
    tau = TaskVector.from_models(A, A_ft)
    batches = [(torch.randn(32, 5, dtype=DT), torch.randint(0, 3, (32,))) for _ in range(2)]
    tv = transfer(A, A_ft, B, batches, ce, name_map={"first": "fc1", "second": "fc2"})
    torch.testing.assert_close(tv["first.weight"], tau["fc1.weight"][perm], atol=1e-8, rtol=0)
    torch.testing.assert_close(tv["second.weight"], tau["fc2.weight"][:, perm], atol=1e-8, rtol=0)
    with pytest.raises(ValueError, match="no counterpart"):
        transfer(A, A_ft, B, batches, ce)


# -- grouped convolutions, bare projections --------------------------------------------------------------

class GroupedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.conv3 = nn.Conv2d(8, 4, 1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        h = torch.tanh(self.conv2(torch.tanh(self.conv1(x))))
        return self.fc(torch.tanh(self.conv3(h)).mean((2, 3)))


def group_perm(g: torch.Generator) -> torch.Tensor:
    """A permutation of 8 channels in 2 groups of 4 that keeps groups: groups swapped, units shuffled inside."""
    inner = torch.randperm(4, generator=g)
    return torch.cat([4 + inner, inner])


def test_grouped_conv_permuted_within_and_among_groups_is_exact():
    g = torch.Generator().manual_seed(5)
    torch.manual_seed(5)
    A = GroupedNet().double()
    p1, p2, p3 = group_perm(g), group_perm(g), torch.randperm(4, generator=g)
    B = GroupedNet().double()
    sa = A.state_dict()
    with torch.no_grad():
        B.conv1.weight.copy_(sa["conv1.weight"][p1])
        B.conv1.bias.copy_(sa["conv1.bias"][p1])
        # a grouped kernel's input axis is local to its group: permute through the dense form
        dense = torch.zeros(8, 8, 3, 3, dtype=DT)
        for grp in range(2):
            dense[4 * grp:4 * grp + 4, 4 * grp:4 * grp + 4] = sa["conv2.weight"][4 * grp:4 * grp + 4]
        dense = dense[p2][:, p1]
        B.conv2.weight.copy_(torch.cat([dense[:4, :4], dense[4:, 4:]]))
        B.conv2.bias.copy_(sa["conv2.bias"][p2])
        B.conv3.weight.copy_(sa["conv3.weight"][p3][:, p2])
        B.conv3.bias.copy_(sa["conv3.bias"][p3])
        B.fc.weight.copy_(sa["fc.weight"][:, p3])
        B.fc.bias.copy_(sa["fc.bias"])
    x = torch.randn(2, 3, 5, 5, dtype=DT)
    torch.testing.assert_close(B(x), A(x))
    A_ft = perturbed(A)
    tv = transfer(A, A_ft, B, [(torch.randn(16, 3, 5, 5, dtype=DT), torch.randint(0, 3, (16,))) for _ in range(2)], ce)
    tau = TaskVector.from_models(A, A_ft)
    dense = torch.zeros(8, 8, 3, 3, dtype=DT)
    for grp in range(2):
        dense[4 * grp:4 * grp + 4, 4 * grp:4 * grp + 4] = tau["conv2.weight"][4 * grp:4 * grp + 4]
    dense = dense[p2][:, p1]
    assert tv["conv2.weight"].shape == (8, 4, 3, 3)
    torch.testing.assert_close(tv["conv2.weight"], torch.cat([dense[:4, :4], dense[4:, 4:]]), atol=1e-8, rtol=0)
    torch.testing.assert_close(tv["conv1.weight"], tau["conv1.weight"][p1], atol=1e-8, rtol=0)


class MisusedParam(nn.Module):
    """A 2-D parameter used elementwise, not as ``x @ P``: ftlab cannot know its spaces."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.mask = nn.Parameter(torch.ones(1, 4))

    def forward(self, x):
        return self.fc(x) * self.mask


def test_a_bare_parameter_not_used_as_a_projection_is_named():
    torch.manual_seed(6)
    A = MisusedParam().double()
    spec = infer_spec(A)
    assert spec.points["mask"].kind == "param"
    batches = [(torch.randn(8, 4, dtype=DT), torch.randint(0, 3, (8,)))]
    with pytest.raises(ValueError, match=r"'mask'.*not used as a projection x @ P"):
        transfer(A, perturbed(A), copy.deepcopy(A), batches, ce)
    # zeroing it is the documented way out
    tv = transfer(A, perturbed(A), copy.deepcopy(A), batches, ce, zero_params=("mask",))
    assert float(tv["mask"].abs().max()) == 0


# -- memory, precision -----------------------------------------------------------------------------------

def test_statistics_that_cannot_fit_are_refused_up_front():
    torch.manual_seed(7)
    A = NamedA().double()
    batches = [(torch.randn(8, 5, dtype=DT), torch.randint(0, 3, (8,)))]
    with pytest.raises(ValueError, match=r"need about .* GB .* statistics, .*the largest float64 sums 7 x 7.* available"):
        transfer(A, perturbed(A), copy.deepcopy(A), batches, ce, memory_limit=1000)
    tv = transfer(A, perturbed(A), copy.deepcopy(A), batches, ce, memory_limit=10**8)
    assert tv.norm() > 0


@pytest.mark.parametrize("staging,prec", [(None, "float32"), (torch.float64, "float64")],
                         ids=["float32 staging", "float64 products"])
def test_rank_is_judged_at_the_precision_of_the_sums(staging, prec):
    """48-wide float32 rows that span 16 dimensions (the CLS-only gradient of the issue): rank 16, not 48, and a
    warning, also when float32 staging leaves rounding of 1e-7 in the other 32 directions."""
    g = torch.Generator().manual_seed(8)
    W = torch.randn(16, 48, generator=g)
    st = CrossMoments(48, 48, batch_dtype=staging)
    for _ in range(20):
        z = torch.randn(512, 16, generator=g)
        st.update(z @ W, z @ W)
    fit = fit_map(st, source="grad", name="proj (out)")
    assert fit.rank == 16 and fit.precision == prec and st.n == 10240
    assert "proj (out)" in fit.note and "rank 16 of 48" in fit.note
    # the map is exact on the 16 determined dimensions and completed (identity here) on the other 32
    torch.testing.assert_close(fit.R, torch.eye(48, dtype=DT), atol=1e-4, rtol=0)
