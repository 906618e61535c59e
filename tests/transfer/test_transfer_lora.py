"""LoRA adapters in and out, checked against peft's own merge on tiny models built here."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

from ftlab.transfer import TaskVector, fit_transfer
from ftlab.transfer.lora import low_rank_factor, read_lora, write_lora

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::ftlab.transfer.align.RankWarning", "ignore::UserWarning")


class Small(nn.Module):
    def __init__(self, width=12, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(20, 8)
        self.fc1 = nn.Linear(8, width)
        self.conv = nn.Conv2d(3, 6, 3)
        self.cls = nn.Linear(width, 3)

    def forward(self, x):
        return self.cls(torch.relu(self.fc1(self.emb(x)))).mean(1)


def _adapter(base: nn.Module, folder, seed=1, **cfg):
    pm = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(**cfg))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n or "modules_to_save" in n:
                p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    pm.save_pretrained(str(folder))
    merged = copy.deepcopy(pm).merge_and_unload()
    return {k: v - base.state_dict()[k] for k, v in merged.state_dict().items() if v.is_floating_point()}


def _close(tv, truth, tol):
    for k, v in truth.items():
        torch.testing.assert_close(tv[k].double(), v.double(), atol=tol, rtol=0, msg=k)


def test_a_lora_adapter_reads_as_the_merged_delta_of_peft(tmp_path):
    base = Small()
    truth = _adapter(base, tmp_path / "a", r=4, lora_alpha=8, target_modules=["fc1", "emb", "conv"],
                     modules_to_save=["cls"], rank_pattern={"conv": 2}, alpha_pattern={"emb": 3})
    got = read_lora(tmp_path / "a", base)
    _close(got.task_vector, truth, 1e-6)
    assert got.ranks == {"fc1": 4, "emb": 4, "conv": 2} and got.saved == ("cls",)


def test_gpt2_fan_in_fan_out_rslora_and_lora_bias_read_as_peft_merges_them(tmp_path):
    cfg = transformers.GPT2Config(n_embd=16, n_layer=2, n_head=2, vocab_size=50, n_positions=32, bos_token_id=0,
                                  eos_token_id=0)
    torch.manual_seed(0)
    base = transformers.GPT2LMHeadModel(cfg)
    truth = _adapter(base, tmp_path / "g", r=3, lora_alpha=6, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True,
                     use_rslora=True, lora_bias=True)
    _close(read_lora(tmp_path / "g", base).task_vector, truth, 1e-6)


@pytest.mark.parametrize("kind,match", [
    ("dora", "DoRA"), ("ia3", "peft_type='IA3'"), ("prompt", "peft_type='PROMPT_TUNING'")])
def test_adapters_ftlab_does_not_read_are_refused_by_name(tmp_path, kind, match):
    base = Small()
    if kind == "dora":
        _adapter(base, tmp_path / "x", r=2, target_modules=["fc1"], use_dora=True)
    else:
        (tmp_path / "x").mkdir()
        (tmp_path / "x" / "adapter_config.json").write_text(json.dumps(
            {"peft_type": "IA3" if kind == "ia3" else "PROMPT_TUNING"}))
    with pytest.raises(ValueError, match=match):
        read_lora(tmp_path / "x", base)


def test_an_adapter_made_for_another_base_is_refused_naming_the_module(tmp_path):
    _adapter(Small(width=12), tmp_path / "a", r=2, target_modules=["fc1"])
    with pytest.raises(ValueError, match=r"module 'fc1'.*\(4, 8\)|'fc1'.*shape"):
        read_lora(tmp_path / "a", Small(width=16))

    class Other(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(8, 12)

    with pytest.raises(ValueError, match="targets module 'fc1', which the base model does not have"):
        read_lora(tmp_path / "a", Other())


def test_low_rank_factor_is_exact_at_the_rank_and_reports_truncation():
    g = torch.Generator().manual_seed(0)
    M = torch.randn(40, 5, generator=g, dtype=torch.float64) @ torch.randn(5, 30, generator=g, dtype=torch.float64)
    B, A, err = low_rank_factor(M)
    assert B.shape[1] == 5 and err < 1e-12
    torch.testing.assert_close(B @ A, M)
    B2, A2, err2 = low_rank_factor(M, max_rank=2)
    assert B2.shape[1] == 2
    assert err2 == pytest.approx(float(torch.linalg.norm(M - B2 @ A2) / torch.linalg.norm(M)), rel=1e-9)


def test_a_transferred_lora_is_written_as_a_peft_adapter_that_merges_to_ftlabs_task_vector(tmp_path):
    A = Small(width=12, seed=0)
    _adapter(A, tmp_path / "src", r=3, lora_alpha=6, target_modules=["fc1", "cls"])
    B = Small(width=20, seed=5)
    g = torch.Generator().manual_seed(2)
    batches = [(torch.randint(0, 20, (8, 5), generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(3)]

    def loss(m, b):
        return nn.functional.cross_entropy(m(b[0]), b[1])

    tau_b = fit_transfer(A, tmp_path / "src", B, batches, loss).task_vector  # the adapter folder as the source
    out = tmp_path / "out"
    out.mkdir()
    rep = write_lora(out, tau_b, B)
    # a rank-3 update stays rank 3 through BiCo's maps: exact factors, no truncation
    assert all(m["rank"] <= 3 and m["truncation_error"] < 1e-9 for m in rep["modules"].values()), rep
    loaded = peft.PeftModel.from_pretrained(copy.deepcopy(B), str(out)).merge_and_unload()
    for k, v in loaded.state_dict().items():
        if v.is_floating_point():
            torch.testing.assert_close(v.double() - B.state_dict()[k].double(), tau_b[k].double(), atol=1e-5, rtol=0,
                                       msg=k)
    # a stated rank truncates, and the report says how much each module lost
    out2 = tmp_path / "out2"
    out2.mkdir()
    rep2 = write_lora(out2, tau_b, B, max_rank=1)
    assert any(m["truncation_error"] > 1e-3 for m in rep2["modules"].values())
    assert json.loads((out2 / "adapter_config.json").read_text())["r"] == 1


def test_norm_deltas_go_to_modules_to_save(tmp_path):
    torch.manual_seed(0)
    B = nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.Linear(6, 2))
    tau = TaskVector({k: 0.1 * torch.randn_like(v) for k, v in B.state_dict().items()})
    out = tmp_path / "o"
    out.mkdir()
    rep = write_lora(out, tau, B)
    assert rep["modules_to_save"] == ["1"] and set(rep["modules"]) == {"0", "2"}
    loaded = peft.PeftModel.from_pretrained(copy.deepcopy(B), str(out)).merge_and_unload()
    for k, v in loaded.state_dict().items():
        torch.testing.assert_close(v - B.state_dict()[k], tau[k], atol=1e-5, rtol=0, msg=k)
