"""Decoder LoRA adapters (Llama, Qwen2, GPT-2) read, written and carried across bases, checked against peft itself.

Tiny random ``transformers`` configs (nothing downloaded): a Llama with grouped-query attention and rotary embeddings
(untied, its adapter on every projection and on ``embed_tokens``/``lm_head``), a Qwen2 with q/k/v biases and
``tie_word_embeddings=True``, and a GPT-2 (HF ``Conv1D`` layers, a ``fan_in_fan_out`` adapter on c_attn/c_proj/c_fc).
Each adapter is a real peft adapter (``get_peft_model`` + ``save_pretrained``) with random nonzero ``lora_A`` and
``lora_B``. What is checked:

* round trip: ftlab reads the adapter and writes it back; peft loads it without warnings and it computes what the
  original computes (logits and merged weights);
* transfer to a wider, deeper target (2 layers x 64 -> 4 layers x 128, another GQA ratio) through ``ftlab transfer
  --out-format lora``: peft loads the adapter without warnings, it targets the user's modules in every target
  layer, its merged delta is the Python API's task vector, the outputs are finite; a self-transfer gives the
  adapter's delta back;
* permuted copies: the target is the source with its residual basis (RMSNorm/LayerNorm gains and biases with it),
  MLP units, whole attention heads (key/value heads with their query groups; inside a head only the value
  dimensions for the rotary models, query/key dimensions jointly and value dimensions for GPT-2, whose positions are
  learned) permuted; the carried adapter merges into exactly the permuted source delta, and the merged model's
  logits are the fine-tuned source's;
* an adapter that changes a tied weight (the LM head sharing the embedding table) is refused in one line, read and
  write.
"""

from __future__ import annotations

import copy
import json
import re
import warnings

import pytest
import torch

from ftlab.transfer import TaskVector, fit_transfer
from ftlab.transfer.adapters import write_transfer_adapter
from ftlab.transfer.lora import read_lora, write_lora

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore::ftlab.transfer.align.RankWarning", "ignore::UserWarning",
                                        "ignore::FutureWarning")

VOCAB = 50
#: the architectures: (transformers class, config class, the user's target modules, fan_in_fan_out)
ARCHS = {
    "llama": ("LlamaForCausalLM", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                                   "embed_tokens", "lm_head"], False),
    "qwen2_tied": ("Qwen2ForCausalLM", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                   False),
    "gpt2": ("GPT2LMHeadModel", ["c_attn", "c_proj", "c_fc"], True),
}


def build(arch: str, width: int = 64, layers: int = 2, heads: int = 4, kv: int = 2, seed: int = 0,
          dtype=torch.float64):
    """A tiny random decoder of ``arch``: MLP width ``2 * width``, head size ``width / heads``, ``kv`` key/value heads."""
    torch.manual_seed(seed)
    if arch == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=width, n_layer=layers, n_head=heads,
                                      bos_token_id=0, eos_token_id=0)
    else:
        cls = transformers.LlamaConfig if arch == "llama" else transformers.Qwen2Config
        cfg = cls(vocab_size=VOCAB, hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=64,
                  tie_word_embeddings=arch == "qwen2_tied", attn_implementation="eager")
    return getattr(transformers, ARCHS[arch][0])(cfg).to(dtype).eval()


def make_adapter(arch: str, base, folder, seed: int = 1):
    """A peft LoRA adapter of ``base`` (rank 4, alpha 8) with random nonzero factors, saved in ``folder``."""
    _, modules, fifo = ARCHS[arch]
    pm = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(r=4, lora_alpha=8, target_modules=modules,
                                                                  fan_in_fan_out=fifo))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.copy_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    pm.save_pretrained(str(folder))
    return pm.eval()


def peft_load(base, folder):
    """``PeftModel.from_pretrained`` on a copy of ``base``; fails on any warning it gives.

    transformers 5 warns that ``is_gradient_checkpointing`` (which peft calls on every model it wraps) is deprecated;
    that one is not about the adapter and is let through."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pm = peft.PeftModel.from_pretrained(copy.deepcopy(base), str(folder))
    other = [str(w.message) for w in caught if "is_gradient_checkpointing" not in str(w.message)]
    assert not other, other
    return pm.eval()


def merged_delta(pm, base) -> TaskVector:
    """The delta peft's own merge puts on ``base``'s parameters (float64)."""
    merged = copy.deepcopy(pm).merge_and_unload().state_dict()
    return TaskVector({k: merged[k].double() - p.detach().double() for k, p in base.named_parameters()})


def rel(tv: TaskVector, truth: TaskVector) -> float:
    return float(TaskVector({k: tv[k].double() - truth[k].double() for k in truth}).norm() / truth.norm())


def lm_batches(seed: int, n: int = 4, size: int = 4, tokens: int = 16):
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": (x := torch.randint(0, VOCAB, (size, tokens), generator=g)), "labels": x.clone()}
            for _ in range(n)]


def hf_loss(model, batch):
    return model(**batch).loss


def logits(model, seed: int = 9):
    ids = torch.randint(0, VOCAB, (3, 12), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(input_ids=ids).logits


def targeted(folder) -> set[str]:
    """The modules an adapter folder holds LoRA factors for (from its tensors, not its config's patterns)."""
    from safetensors.torch import load_file

    keys = load_file(str(folder / "adapter_model.safetensors"))
    return {re.sub(r"^base_model\.model\.|\.lora_(A|B|embedding_A|embedding_B)(\.weight)?$", "", k) for k in keys
            if ".lora_" in k}


# --- round trip -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", list(ARCHS))
def test_a_decoder_adapter_read_and_written_back_by_ftlab_is_the_same_adapter(arch, tmp_path):
    A = build(arch, dtype=torch.float32)
    pm = make_adapter(arch, A, tmp_path / "src")
    ad = read_lora(tmp_path / "src", A)
    out = tmp_path / "back"
    out.mkdir()
    rep = write_lora(out, ad.task_vector, A)
    assert all(m["rank"] == 4 and m["truncation_error"] < 1e-9 for m in rep["modules"].values())
    back = peft_load(A, out)
    assert targeted(out) == targeted(tmp_path / "src")
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["fan_in_fan_out"] is ARCHS[arch][2] and not cfg["modules_to_save"]
    # float32 adapters on a float32 model: the factors are re-factored in float64 and stored in float32
    want, got = logits(pm), logits(back)
    assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())
    truth = merged_delta(pm, A)
    assert truth.norm() > 0
    assert rel(merged_delta(back, A), truth) < 1e-6
    assert rel(ad.task_vector, truth) < 1e-6  # what ftlab reads is peft's merge


@pytest.mark.parametrize("arch", ["qwen2_tied", "gpt2"])
def test_an_adapter_that_trains_the_targeted_biases_round_trips(arch, tmp_path):
    """peft's ``bias="lora_only"`` saves each targeted layer's trained bias as ``<module>.base_layer.bias`` (Qwen2's
    q/k/v and GPT-2's ``Conv1D`` layers have biases): read as the bias delta and written back so that peft loads it
    without warnings and merges it."""
    A = build(arch, 32)
    _, modules, fifo = ARCHS[arch]
    pm = peft.get_peft_model(copy.deepcopy(A), peft.LoraConfig(r=2, target_modules=modules, fan_in_fan_out=fifo,
                                                                bias="lora_only"))
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for _, p in pm.named_parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    pm.save_pretrained(str(tmp_path / "src"))
    truth = merged_delta(pm, A)
    assert any(k.endswith(".bias") and float(v.norm()) > 0 for k, v in truth.items())
    tau = read_lora(tmp_path / "src", A).task_vector
    assert rel(tau, truth) < 1e-12
    out = tmp_path / "back"
    out.mkdir()
    write_lora(out, tau, A)
    cfg = json.loads((out / "adapter_config.json").read_text())
    # GPT-2: every targeted layer has a bias, so lora_B biases; Qwen2's o_proj and MLP have none, where peft could not
    # merge a lora_B bias: the trained biases are written as peft writes them
    assert (cfg["lora_bias"], cfg["bias"]) == ((True, "none") if arch == "gpt2" else (False, "lora_only"))
    assert rel(merged_delta(peft_load(A, out), A), truth) < 1e-6  # float32 factors and biases


# --- across width and depth -----------------------------------------------------------------------------------

#: source and target shapes (width, layers, heads, kv heads): the GQA ratio changes for Llama (2 -> 4) and Qwen2
#: (2 -> 1: the target has full multi-head attention)
SHAPES = {"llama": ((64, 2, 4, 2), (128, 4, 8, 2)), "qwen2_tied": ((64, 2, 4, 2), (128, 4, 8, 8)),
          "gpt2": ((64, 2, 4, 4), (128, 4, 8, 8))}


def doc_command(hf_class: str) -> list[str]:
    """The ``ftlab transfer`` arguments of docs/transfer.md's decoder example, with ``--hf-class`` set."""
    import shlex
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "transfer.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- decoder-example -->\n```bash\n(.*?)```", text, re.S)
    assert block, "docs/transfer.md has no decoder example"
    argv = shlex.split(block.group(1).replace("\\\n", " "))[1:]
    argv[argv.index("--hf-class") + 1] = hf_class
    return argv


@pytest.mark.parametrize("arch", list(ARCHS))
def test_ftlab_transfer_carries_a_decoder_adapter_to_a_wider_deeper_base(arch, tmp_path, capsys, monkeypatch):
    """docs/transfer.md's decoder example as written (the folder names are names), for each architecture."""
    from safetensors.torch import save_file

    from ftlab.cli.main import main

    monkeypatch.chdir(tmp_path)
    (w0, l0, h0, k0), (w1, l1, h1, k1) = SHAPES[arch]
    A = build(arch, w0, l0, h0, k0, seed=0, dtype=torch.float32)
    B = build(arch, w1, l1, h1, k1, seed=1, dtype=torch.float32)
    A.save_pretrained("small-llama")
    B.save_pretrained("wide-llama")
    make_adapter(arch, A, tmp_path / "small-llama-lora")
    batches = lm_batches(3, n=1, size=12, tokens=10)
    save_file({k: v for k, v in batches[0].items()}, "calib.safetensors")
    out = tmp_path / "wide-llama-lora"
    try:
        main(doc_command(ARCHS[arch][0]))
    except SystemExit as exc:
        assert exc.code in (0, None), capsys.readouterr().err
    carried = peft_load(B, out)
    # the adapter targets what the user's adapter config targets on B (in every one of its layers), nothing else
    _, modules, fifo = ARCHS[arch]
    users = peft.get_peft_model(copy.deepcopy(B), peft.LoraConfig(r=4, target_modules=modules, fan_in_fan_out=fifo))
    assert targeted(out) == set(users.targeted_module_names)
    assert {int(m) for m in re.findall(r"\.(\d+)\.", " ".join(targeted(out)))} == set(range(l1))
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["fan_in_fan_out"] is fifo and not cfg["modules_to_save"] and cfg["r"] == 4
    assert torch.isfinite(logits(carried)).all()
    # the command's adapter merges into the task vector the Python API computes for the same models and data
    # (the command splits the file into its default batches of 32 rows: here one batch; it loads the models as
    # load_model does, with the attention implementation transformers picks for a saved folder)
    from ftlab.transfer.io import load_model

    A, B = (load_model(None, f, hf_class=ARCHS[arch][0], role=r) for f, r in (("small-llama", "source base"),
                                                                                 ("wide-llama", "target base")))
    tau_b = fit_transfer(A, tmp_path / "small-llama-lora", B, batches, hf_loss).task_vector
    assert tau_b.norm() > 0
    assert rel(merged_delta(carried, B), TaskVector({k: tau_b[k] for k in tau_b})) < 1e-6  # float32 factors


@pytest.mark.parametrize("arch", list(ARCHS))
def test_a_decoder_adapter_carried_to_its_own_base_is_the_adapter(arch, tmp_path):
    A = build(arch)
    pm = make_adapter(arch, A, tmp_path / "src")
    tau_a = read_lora(tmp_path / "src", A).task_vector
    res = fit_transfer(A, tmp_path / "src", A, lm_batches(2, n=2, tokens=8), hf_loss)  # 64 rows: maps completed
    assert rel(res.task_vector, TaskVector({k: tau_a[k] for k in res.task_vector})) < 1e-9
    out = tmp_path / "self"
    out.mkdir()
    write_transfer_adapter(out, res, A)
    assert targeted(out) == targeted(tmp_path / "src")
    assert rel(merged_delta(peft_load(A, out), A), merged_delta(pm, A)) < 1e-6  # float32 factors


# --- permuted copies ------------------------------------------------------------------------------------------


def _rows(blocks, size):
    """Indices of the blocks of ``size`` in the order ``blocks`` lists them."""
    return torch.cat([torch.arange(b * size, (b + 1) * size) for b in blocks])


def _state_permutation(block: str, rules, per_layer, res, norms: tuple[str, ...], tables: tuple[str, ...]):
    """A state-dict permutation: block ``i``'s entries (``<block>.<i>.<rest>``) by ``rules[rest](t, per_layer[i])``,
    the final norm's ``norms`` along the residual permutation ``res``, the ``(rows, d)`` ``tables`` along their columns."""

    def permute(state):
        out = {}
        for k, t in state.items():
            m = re.match(re.escape(block) + r"\.(\d+)\.(.*)", k)
            if m:
                out[k] = rules[m.group(2)](t, per_layer[int(m.group(1))])
            elif k in norms:
                out[k] = t[res]
            elif k in tables:
                out[k] = t[:, res]
            else:
                raise KeyError(k)
        return out

    return permute


def rotary_permutation(g, d, heads, kv, inter, layers):
    """A function-preserving permutation of a Llama/Qwen2 state dict: residual basis (norm gains with it), MLP units,
    key/value heads each with its query group, query heads within their group, value dimensions within each
    key/value head (with the output projection's columns); query/key dimensions stay (the rotary embedding pairs
    them). Returns ``permute(state) -> state``, also for task vectors (same names)."""
    hd, r = d // heads, heads // kv
    res = torch.randperm(d, generator=g)
    per_layer = []
    for _ in range(layers):
        kvp = torch.randperm(kv, generator=g)
        qh = torch.cat([kvp[j] * r + torch.randperm(r, generator=g) for j in range(kv)])
        pv = [torch.randperm(hd, generator=g) for _ in range(kv)]
        v = torch.cat([kvp[j] * hd + pv[j] for j in range(kv)])
        o = torch.cat([qh[s] * hd + pv[s // r] for s in range(heads)])
        per_layer.append({"q": _rows(qh.tolist(), hd), "k": _rows(kvp.tolist(), hd), "v": v, "o": o,
                          "mlp": torch.randperm(inter, generator=g)})
    rules = {"self_attn.q_proj.weight": lambda t, p: t[p["q"]][:, res], "self_attn.q_proj.bias": lambda t, p: t[p["q"]],
             "self_attn.k_proj.weight": lambda t, p: t[p["k"]][:, res], "self_attn.k_proj.bias": lambda t, p: t[p["k"]],
             "self_attn.v_proj.weight": lambda t, p: t[p["v"]][:, res], "self_attn.v_proj.bias": lambda t, p: t[p["v"]],
             "self_attn.o_proj.weight": lambda t, p: t[res][:, p["o"]],
             "mlp.gate_proj.weight": lambda t, p: t[p["mlp"]][:, res],
             "mlp.up_proj.weight": lambda t, p: t[p["mlp"]][:, res],
             "mlp.down_proj.weight": lambda t, p: t[res][:, p["mlp"]],
             "input_layernorm.weight": lambda t, p: t[res], "post_attention_layernorm.weight": lambda t, p: t[res]}

    return _state_permutation("model.layers", rules, per_layer, res, ("model.norm.weight",),
                              ("model.embed_tokens.weight", "lm_head.weight"))


def gpt2_permutation(g, d, heads, inter, layers):
    """A function-preserving permutation of a GPT-2 state dict (``Conv1D`` weights stored ``(in, out)``): residual
    basis (LayerNorm gains and biases, token and position embeddings with it), MLP units, heads (their q, k and v
    thirds of ``c_attn`` together), query/key dimensions within a head jointly, value dimensions within a head with
    ``c_proj``'s rows."""
    hd = d // heads
    res = torch.randperm(d, generator=g)
    per_layer = []
    for _ in range(layers):
        hp = torch.randperm(heads, generator=g).tolist()
        pqk = [torch.randperm(hd, generator=g) for _ in range(heads)]
        pv = [torch.randperm(hd, generator=g) for _ in range(heads)]
        qk = torch.cat([h * hd + pqk[h] for h in hp])
        v = torch.cat([h * hd + pv[h] for h in hp])
        per_layer.append({"qkv": torch.cat([qk, d + qk, 2 * d + v]), "v": v, "mlp": torch.randperm(inter, generator=g)})
    rules = {"attn.c_attn.weight": lambda t, p: t[res][:, p["qkv"]], "attn.c_attn.bias": lambda t, p: t[p["qkv"]],
             "attn.c_proj.weight": lambda t, p: t[p["v"]][:, res], "attn.c_proj.bias": lambda t, p: t[res],
             "mlp.c_fc.weight": lambda t, p: t[res][:, p["mlp"]], "mlp.c_fc.bias": lambda t, p: t[p["mlp"]],
             "mlp.c_proj.weight": lambda t, p: t[p["mlp"]][:, res], "mlp.c_proj.bias": lambda t, p: t[res],
             "ln_1.weight": lambda t, p: t[res], "ln_1.bias": lambda t, p: t[res],
             "ln_2.weight": lambda t, p: t[res], "ln_2.bias": lambda t, p: t[res]}

    return _state_permutation("transformer.h", rules, per_layer, res, ("transformer.ln_f.weight", "transformer.ln_f.bias"),
                              ("transformer.wte.weight", "transformer.wpe.weight", "lm_head.weight"))


@pytest.mark.parametrize("arch", list(ARCHS))
def test_a_decoder_adapter_carried_to_a_permuted_copy_is_the_permuted_adapter(arch, tmp_path):
    d, layers, heads, kv = 32, 2, 4, (4 if arch == "gpt2" else 2)
    A = build(arch, d, layers, heads, kv)
    g = torch.Generator().manual_seed(7)
    if arch == "gpt2":
        permute = gpt2_permutation(g, d, heads, 4 * d, layers)
    else:
        permute = rotary_permutation(g, d, heads, kv, 2 * d, layers)
    B = build(arch, d, layers, heads, kv, seed=3)
    B.load_state_dict(permute(A.state_dict()))
    # the copy computes A's function (to float32 rounding: the rotary models' eager attention takes its softmax in
    # float32 also for float64 weights, and a permuted sum rounds differently there)
    want = logits(A)
    assert float((logits(B) - want).abs().max()) <= 1e-6 * float(want.abs().max())
    pm = make_adapter(arch, A, tmp_path / "src")
    tau_a = read_lora(tmp_path / "src", A).task_vector
    truth = TaskVector(permute(dict(tau_a.items())))
    res = fit_transfer(A, tmp_path / "src", B, lm_batches(5), hf_loss)  # 320 token rows: every map determined
    # float64 statistics; the float32 softmax above leaves about 6e-8 (Llama, Qwen2; 2e-12 for GPT-2)
    assert rel(res.task_vector, TaskVector({k: truth[k] for k in res.task_vector})) < 1e-6
    out = tmp_path / "carried"
    out.mkdir()
    write_transfer_adapter(out, res, B)
    carried = peft_load(B, out)
    assert targeted(out) == targeted(tmp_path / "src")
    # the adapter's merged delta is the permuted source delta (its factors are stored in float32)
    assert rel(merged_delta(carried, B), TaskVector({k: truth[k] for k, _ in B.named_parameters()})) < 1e-5
    # and the merged target computes the fine-tuned source's function
    want = logits(copy.deepcopy(pm).merge_and_unload())
    got = logits(copy.deepcopy(carried).merge_and_unload())
    assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())


# --- tied weights ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("module", ["lm_head", "embed_tokens"])
def test_an_adapter_changing_a_tied_weight_is_refused_naming_it(module, tmp_path, capsys):
    A = build("qwen2_tied", 32)
    pm = peft.get_peft_model(copy.deepcopy(A), peft.LoraConfig(r=2, target_modules=[module, "q_proj"]))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.add_(0.1)
    pm.save_pretrained(str(tmp_path / "a"))
    with pytest.raises(ValueError, match=r"changes '(lm_head|model\.embed_tokens)\.weight', which is tied to "
                                         r"'(model\.embed_tokens|lm_head)\.weight'") as err:
        read_lora(tmp_path / "a", A)
    assert "\n" not in str(err.value)
    # on the command line: one line, exit status 2, nothing written
    from safetensors.torch import save_file

    from ftlab.cli.main import main

    A.save_pretrained(tmp_path / "A")
    batches = lm_batches(1, n=1, tokens=8)
    save_file(dict(batches[0]), str(tmp_path / "cal.safetensors"))
    with pytest.raises(SystemExit) as exc:
        main(["transfer", "--source-base", str(tmp_path / "A"), "--source-finetuned", str(tmp_path / "a"),
              "--target-base", str(tmp_path / "A"), "--hf-class", "Qwen2ForCausalLM", "--data",
              str(tmp_path / "cal.safetensors"), "--loss", "hf", "--out", str(tmp_path / "cli")])
    err = [ln for ln in capsys.readouterr().err.splitlines() if "which is tied to" in ln]
    assert exc.value.code == 2 and len(err) == 1 and not (tmp_path / "cli").exists()
    tau = TaskVector({k: torch.zeros_like(p) for k, p in A.named_parameters()})
    out = tmp_path / "o"
    out.mkdir()
    write_lora(out, tau, A)  # nothing changes the tied table: written
    tau = TaskVector({k: (0.1 if "embed" in k else 0.0) * torch.ones_like(p) for k, p in A.named_parameters()})
    with pytest.raises(ValueError, match=r"changes 'model\.embed_tokens\.weight', which is tied to 'lm_head\.weight'"):
        write_lora(out, tau, A)


def test_an_untied_embedding_adapter_is_read_with_the_base_weights_peft_saves_along():
    """peft saves a targeted ``embed_tokens``/``lm_head``'s base weight with the adapter (``base_layer``); ftlab adds
    its difference from the base (zero here) to the LoRA delta: the read delta is peft's merge (the round-trip test
    covers the values; this one the saved tensors)."""
    from pathlib import Path
    from tempfile import TemporaryDirectory

    from safetensors.torch import load_file

    A = build("llama", 32)
    with TemporaryDirectory() as tmp:
        pm = make_adapter("llama", A, Path(tmp))
        keys = load_file(str(Path(tmp) / "adapter_model.safetensors"))
        assert {"base_model.model.lm_head.base_layer.weight", "base_model.model.model.embed_tokens.base_layer.weight"} \
            <= set(keys)
        tau = read_lora(tmp, A).task_vector
    truth = merged_delta(pm, A)
    for k in ("lm_head.weight", "model.embed_tokens.weight"):
        assert float(truth[k].norm()) > 0
        torch.testing.assert_close(tau[k], truth[k], atol=1e-12, rtol=0)
