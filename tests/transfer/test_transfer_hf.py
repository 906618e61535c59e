"""Hugging Face models (random tiny configs) are understood without hand-written specs.

Table-driven over BERT, ViT, CLIP (vision tower), T5 and GPT-2; a Llama decoder with grouped-query attention
recovered from a permuted copy. For a target that is at least as wide
as the source in every space, every fitted map has orthonormal rows, so each layer's transported
delta keeps exactly the source delta's norm, whatever the calibration data: a check that every
parameter is carried on the right axes by the right maps.
"""

from __future__ import annotations

import copy

import pytest
import torch

from ftlab.transfer import TaskVector, TransferOptions, fit_transfer, infer_spec

transformers = pytest.importorskip("transformers")
torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore::ftlab.transfer.align.RankWarning")


def _ids(g, n=4, t=8, vocab=30):
    return torch.randint(0, vocab, (n, t), generator=g)


def bert(width):
    cfg = transformers.BertConfig(vocab_size=30, hidden_size=width, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=2 * width, max_position_embeddings=16, num_labels=3)
    return transformers.BertForSequenceClassification(cfg)


def bert_batches(g):
    return [{"input_ids": _ids(g), "labels": torch.randint(0, 3, (4,), generator=g)} for _ in range(3)]


def vit(width):
    cfg = transformers.ViTConfig(image_size=16, patch_size=8, num_channels=3, hidden_size=width, num_hidden_layers=2,
                                 num_attention_heads=2, intermediate_size=2 * width, num_labels=3)
    return transformers.ViTForImageClassification(cfg)


def image_batches(g):
    return [{"pixel_values": torch.randn(4, 3, 16, 16, generator=g), "labels": torch.randint(0, 3, (4,), generator=g)}
            for _ in range(3)]


def clip(width):
    cfg = transformers.CLIPVisionConfig(image_size=16, patch_size=8, hidden_size=width, num_hidden_layers=2,
                                        num_attention_heads=2, intermediate_size=2 * width, projection_dim=width)
    return transformers.CLIPVisionModelWithProjection(cfg)


def t5(width):
    cfg = transformers.T5Config(vocab_size=30, d_model=width, d_kv=width // 2, d_ff=2 * width, num_layers=2,
                                num_decoder_layers=2, num_heads=2, decoder_start_token_id=0, pad_token_id=0)
    return transformers.T5ForConditionalGeneration(cfg)


def t5_batches(g):
    return [{"input_ids": _ids(g), "labels": _ids(g, t=5)} for _ in range(3)]


def gpt2(width):
    cfg = transformers.GPT2Config(vocab_size=30, n_positions=16, n_embd=width, n_layer=2, n_head=2)
    return transformers.GPT2LMHeadModel(cfg)  # Conv1D layers (weights stored in x out), tied LM head


def lm_batches(g):
    return [{"input_ids": (ids := _ids(g)), "labels": ids} for _ in range(3)]


def hf_loss(model, batch):
    return model(**batch).loss


def clip_loss(model, batch):
    out = model(pixel_values=batch["pixel_values"]).image_embeds
    return torch.nn.functional.cross_entropy(out[:, :3], batch["labels"])


CASES = {"bert": (bert, bert_batches, hf_loss), "vit": (vit, image_batches, hf_loss),
         "clip": (clip, image_batches, clip_loss), "t5": (t5, t5_batches, hf_loss), "gpt2": (gpt2, lm_batches, hf_loss)}


@pytest.mark.parametrize("name", list(CASES))
def test_hf_models_transfer_isometrically_to_a_wider_target(name):
    build, make_batches, loss = CASES[name]
    torch.manual_seed(0)
    A = build(16)
    A_ft = copy.deepcopy(A)
    with torch.no_grad():
        for p in A_ft.parameters():
            p.add_(0.01 * torch.randn_like(p))
    torch.manual_seed(1)
    B = build(24)
    spec = infer_spec(B)
    res = fit_transfer(A, A_ft, B, make_batches(torch.Generator().manual_seed(2)), loss,
                       options=TransferOptions(diagnostics=True))
    tv = res.task_vector
    assert set(tv) == {k for k, _ in B.named_parameters()}
    assert all(torch.isfinite(v).all() for v in tv.values())
    zero = [k for k, rs in spec.rules.items() if all(r.kind == "zero" for r in rs)]
    assert all(float(tv[k].abs().max()) == 0 for k in zero)
    assert res.layers(), "no layer was transported"
    for rec in res.layers():
        assert rec["target_norm"] == pytest.approx(rec["source_norm"], rel=1e-5, abs=1e-9), rec["target"]
    # applying it gives a model that still runs
    m = tv.apply(B)
    batch = make_batches(torch.Generator().manual_seed(3))[0]
    assert torch.isfinite(loss(m, batch))
    applied = TaskVector.from_models(B, m)  # tied weights appear under every name here, each added once
    assert TaskVector({k: applied[k] - tv[k] for k in tv}).norm() < 1e-5 * max(tv.norm(), 1e-12)


def test_vit_with_other_resolution_needs_token_interpolation():
    """Same images at 16 px (2x2 patches + CLS) for A and 24 px (3x3 + CLS) for B: rows paired by interpolate2d."""
    def vit_res(width, image):
        cfg = transformers.ViTConfig(image_size=image, patch_size=8, hidden_size=width, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=2 * width, num_labels=3)
        return transformers.ViTForImageClassification(cfg)

    torch.manual_seed(0)
    A, B = vit_res(16, 16), vit_res(24, 24)
    A_ft = copy.deepcopy(A)
    with torch.no_grad():
        for p in A_ft.parameters():
            p.add_(0.01 * torch.randn_like(p))
    src = image_batches(torch.Generator().manual_seed(5))
    tgt = [{"pixel_values": torch.nn.functional.interpolate(b["pixel_values"], size=24, mode="bilinear"),
            "labels": b["labels"]} for b in src]
    with pytest.raises(ValueError, match="equal token counts"):
        fit_transfer(A, A_ft, B, source_batches=src, target_batches=tgt, loss=hf_loss)
    res = fit_transfer(A, A_ft, B, source_batches=src, target_batches=tgt, loss=hf_loss,
                       options=TransferOptions(seq_align="interpolate2d"))
    rows = {r["target"]: r for r in res.layers()}
    # the patch conv's rows are its 3x3 output grid (A's 2x2 grid resampled); transformer rows are 10 tokens
    assert rows["vit.embeddings.patch_embeddings.projection"]["in_rows"] == 3 * 4 * 9
    assert rows["vit.layers.0.attention.q_proj"]["in_rows"] == 3 * 4 * 10
    for rec in rows.values():
        assert rec["target_norm"] == pytest.approx(rec["source_norm"], rel=1e-5, abs=1e-9)


def llama(width=32, inter=48, heads=4, kv=2, layers=2, vocab=40):
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=width, intermediate_size=inter, num_hidden_layers=layers,
                                   num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=64,
                                   tie_word_embeddings=False, attn_implementation="eager")
    return transformers.LlamaForCausalLM(cfg).double().eval()


def llama_permutation(g, d=32, head_dim=8, heads=4, kv=2, inter=48, layers=2):
    """A permutation of a Llama's units that keeps its function: residual dimensions, key/value heads with their
    query groups (grouped-query attention; dimensions inside a head stay, for the rotary embedding), MLP units."""
    import re

    res = torch.randperm(d, generator=g)
    kvp = torch.randperm(kv, generator=g)
    r = heads // kv
    qheads = torch.cat([kvp[j] * r + torch.randperm(r, generator=g) for j in range(kv)])

    def rows(hs):
        return torch.cat([torch.arange(h * head_dim, (h + 1) * head_dim) for h in hs.tolist()])

    q, kvr = rows(qheads), rows(kvp)
    mlp = [torch.randperm(inter, generator=g) for _ in range(layers)]
    rule = {"self_attn.q_proj.weight": lambda v, i: v[q][:, res],
            "self_attn.k_proj.weight": lambda v, i: v[kvr][:, res], "self_attn.v_proj.weight": lambda v, i: v[kvr][:, res],
            "self_attn.o_proj.weight": lambda v, i: v[res][:, q], "mlp.gate_proj.weight": lambda v, i: v[mlp[i]][:, res],
            "mlp.up_proj.weight": lambda v, i: v[mlp[i]][:, res], "mlp.down_proj.weight": lambda v, i: v[res][:, mlp[i]],
            "input_layernorm.weight": lambda v, i: v[res], "post_attention_layernorm.weight": lambda v, i: v[res]}

    def permute(state):
        out = {}
        for k, v in state.items():
            m = re.match(r"model\.layers\.(\d+)\.(.*)", k)
            if m:
                out[k] = rule[m.group(2)](v, int(m.group(1)))
            elif k == "model.norm.weight":
                out[k] = v[res]
            else:  # embed_tokens, lm_head: (vocab, d)
                out[k] = v[:, res]
        return out

    return permute


def test_a_llama_decoder_with_grouped_query_attention_is_recovered_from_a_permuted_copy():
    torch.manual_seed(0)
    A = llama()
    g = torch.Generator().manual_seed(1)
    permute = llama_permutation(g)
    B = llama()
    B.load_state_dict(permute(A.state_dict()))
    ids = torch.randint(0, 40, (4, 12), generator=g)
    with torch.no_grad():
        torch.testing.assert_close(B(input_ids=ids).logits, A(input_ids=ids).logits, atol=1e-6, rtol=0)
    batches = [{"input_ids": (x := torch.randint(0, 40, (4, 12), generator=g)), "labels": x} for _ in range(4)]
    A_ft = copy.deepcopy(A)
    with torch.no_grad():
        for p in A_ft.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    truth = TaskVector(permute(dict(TaskVector.from_models(A, A_ft).items())))
    tv = fit_transfer(A, A_ft, B, batches, hf_loss).task_vector
    assert TaskVector({k: tv[k] - truth[k] for k in tv}).norm() < 1e-5 * truth.norm()
