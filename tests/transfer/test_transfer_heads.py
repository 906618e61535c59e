"""Heads new in both bases (ftlab.transfer.heads): found, fitted, carried, and independent of B's random head."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ftlab.transfer import TaskVector, TransferOptions, fit_transfer
from ftlab.transfer.adapters import write_transfer_adapter
from ftlab.transfer.heads import find_new_heads, fit_linear_head

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore::ftlab.transfer.align.RankWarning", "ignore::UserWarning",
                                        "ignore::FutureWarning")


def bert(width: int, layers: int, seed: int, labels: int = 3):
    cfg = transformers.BertConfig(vocab_size=30, hidden_size=width, num_hidden_layers=layers, num_attention_heads=2,
                                  intermediate_size=2 * width, max_position_embeddings=16, num_labels=labels)
    torch.manual_seed(seed)
    return transformers.BertForSequenceClassification(cfg).eval()


def seq_cls_adapter(A, folder, seed=2, modules_to_save=("classifier",)):
    """A PEFT LoRA on query/value with the classifier in modules_to_save, its tensors moved off their start."""
    pm = peft.get_peft_model(copy.deepcopy(A), peft.LoraConfig(r=2, target_modules=["query", "value"],
                                                                modules_to_save=list(modules_to_save) or None))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n or "modules_to_save" in n:
                p.add_(0.2 * torch.randn(p.shape, generator=g))
    pm.save_pretrained(str(folder))
    return pm


def batches(seed=3, n=3, b=8, classes=3):
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(0, 30, (b, 6), generator=g), "labels": torch.randint(0, classes, (b,), generator=g)}
            for _ in range(n)]


def hf_loss(model, batch):
    return model(**batch).loss


def test_the_written_adapter_does_not_depend_on_the_random_head_in_bs_folder(tmp_path):
    A = bert(16, 2, 0)
    seq_cls_adapter(A, tmp_path / "ad")
    B1 = bert(24, 3, 1)
    B2 = copy.deepcopy(B1)
    torch.manual_seed(7)
    B2.classifier.reset_parameters()  # another draw of B's new head, everything else the same
    assert (B1.classifier.weight - B2.classifier.weight).abs().max() > 1e-3
    outs = []
    for i, B in enumerate((B1, B2)):
        res = fit_transfer(A, tmp_path / "ad", B, batches(), hf_loss)
        assert res.heads is not None and res.heads.used == "refit" and list(res.heads.target) == ["classifier"]
        folder = tmp_path / f"out{i}"
        folder.mkdir()
        rep = write_transfer_adapter(folder, res, B, alpha=1.0)
        assert rep["modules_to_save"] == ["classifier"]  # written whole, not as a LoRA on top of B's head
        model = peft.PeftModel.from_pretrained(copy.deepcopy(B), str(folder))
        outs.append(model(**{k: v for k, v in batches(9)[0].items() if k != "labels"}).logits.detach())
        torch.testing.assert_close(outs[-1], res.model(B, 1.0)(input_ids=batches(9)[0]["input_ids"]).logits.detach(),
                                   atol=1e-5, rtol=0)
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=0)
    # the old behaviour (the head as a delta) does depend on it
    deltas = [fit_transfer(A, tmp_path / "ad", B, batches(), hf_loss, options=TransferOptions(heads="delta"))
              for B in (B1, B2)]
    assert (deltas[0].model(B1).classifier.weight - deltas[1].model(B2).classifier.weight).abs().max() > 1e-3


def test_models_are_left_as_they_were_and_the_head_is_not_transported(tmp_path):
    A, B = bert(16, 2, 0), bert(24, 2, 1)
    seq_cls_adapter(A, tmp_path / "ad")
    before = [{k: v.clone() for k, v in m.state_dict().items()} for m in (A, B)]
    res = fit_transfer(A, tmp_path / "ad", B, batches(), hf_loss)
    for m, st in zip((A, B), before):
        for k, v in m.state_dict().items():
            assert torch.equal(v, st[k]), k
    assert float(res.task_vector["classifier.weight"].abs().max()) == 0  # the head is installed, not a delta
    assert res.report()["heads"]["target"] == ["classifier"]


def test_heads_are_found_from_the_adapter_and_not_for_lm_heads_or_plain_models(tmp_path):
    A, B = bert(16, 2, 0), bert(24, 2, 1)
    seq_cls_adapter(A, tmp_path / "with")
    seq_cls_adapter(A, tmp_path / "without", modules_to_save=())
    assert find_new_heads(A, B, tmp_path / "with", ("auto",)) == (["classifier"], ["classifier"])
    assert find_new_heads(A, B, tmp_path / "without", ("auto",)) == ([], [])
    assert find_new_heads(A, B, tmp_path / "with", ()) == ([], [])
    gpt = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=30, n_positions=16, n_embd=8, n_layer=1,
                                                               n_head=2))
    pm = peft.get_peft_model(copy.deepcopy(gpt), peft.LoraConfig(r=2, target_modules=["c_attn"],
                                                                 modules_to_save=["lm_head"]))
    pm.save_pretrained(str(tmp_path / "lm"))
    assert find_new_heads(gpt, gpt, tmp_path / "lm", ("auto",)) == ([], [])  # a pretrained LM head is no task head
    mlp = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    assert find_new_heads(mlp, mlp, mlp, ("auto",)) == ([], [])
    assert find_new_heads(mlp, mlp, mlp, ("2",), lambda n: n) == (["2"], ["2"])
    with pytest.raises(ValueError, match="'head' names no module"):
        find_new_heads(mlp, mlp, mlp, ("head",))


def test_a_carried_head_is_the_permuted_trained_head_on_a_permuted_copy():
    """B = A with its hidden units permuted; the head (random in both) is new: carried, it is A's trained head with
    its input axis permuted, exactly (the head's input rows outnumber its width)."""
    torch.manual_seed(0)
    A = nn.Sequential(nn.Linear(5, 12), nn.Tanh(), nn.Linear(12, 3)).double()
    A_ft = copy.deepcopy(A)
    with torch.no_grad():
        for p in A_ft.parameters():
            p.add_(0.3 * torch.randn_like(p))
    perm = torch.randperm(12)
    B = copy.deepcopy(A)
    with torch.no_grad():
        B[0].weight.copy_(A[0].weight[perm])
        B[0].bias.copy_(A[0].bias[perm])
        B[2].weight.copy_(torch.randn(3, 12, dtype=torch.float64))  # B's own random head
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(16, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (16,), generator=g))
            for _ in range(3)]

    def ce(m, b):
        return nn.functional.cross_entropy(m(b[0]), b[1])

    res = fit_transfer(A, A_ft, B, data, ce, options=TransferOptions(new_heads=("2",), heads="carry"))
    head = res.model(B)[2]
    torch.testing.assert_close(head.weight, A_ft[2].weight[:, perm], atol=1e-8, rtol=0)
    torch.testing.assert_close(head.bias, A_ft[2].bias, atol=1e-12, rtol=0)
    tv = res.task_vector  # the encoder's update: permuted exactly
    torch.testing.assert_close(tv["0.weight"], (A_ft[0].weight - A[0].weight)[perm], atol=1e-8, rtol=0)


def test_refit_recovers_a_planted_linear_rule():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(400, 6, generator=g, dtype=torch.float64) * 3 + 1
    W = torch.randn(4, 6, generator=g, dtype=torch.float64)
    b = torch.randn(4, generator=g, dtype=torch.float64)
    y = (X @ W.T + b).argmax(1)
    W_fit, b_fit, rec = fit_linear_head(X[:300], y[:300], 4)
    assert rec["lambda"] in (1e-4, 1e-3, 1e-2, 1e-1, 1.0) and rec["rows"] == 300
    assert float(((X[300:] @ W_fit.T + b_fit).argmax(1) == y[300:]).double().mean()) >= 0.95
    # the cross-validation path warm-starts each fit from the previous penalty's: the chosen penalty fitted from
    # zero gives the same head (the optimum is unique; only the iterations differ)
    W_cold, b_cold, _ = fit_linear_head(X[:300], y[:300], 4, grid=(rec["lambda"],))
    torch.testing.assert_close(W_fit, W_cold, atol=1e-4 * float(W_cold.abs().max()), rtol=0)
    torch.testing.assert_close(b_fit, b_cold, atol=1e-4 * float(b_cold.abs().max()) + 1e-6, rtol=0)
    # float targets: ridge regression, exact at a negligible penalty
    Y = X @ W.T + b
    W_r, b_r, _ = fit_linear_head(X, Y, 4, grid=(1e-12,))
    torch.testing.assert_close(W_r, W, atol=1e-6, rtol=0)
    torch.testing.assert_close(b_r, b, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="labels must be"):
        fit_linear_head(X[:10], torch.full((10,), 7), 4)


def test_refit_without_labels_carries_the_head_and_says_why(tmp_path):
    A, B = bert(16, 2, 0), bert(24, 2, 1)
    seq_cls_adapter(A, tmp_path / "ad")
    unlabelled = [{"input_ids": b["input_ids"]} for b in batches()]
    res = fit_transfer(A, tmp_path / "ad", B, unlabelled, method="activation_only")
    assert res.heads is not None and res.heads.used == "carry"
    assert "no labels" in res.heads.report()["note"]


def test_a_head_of_two_layers_is_refitted_with_its_first_layer_set_to_the_identity(tmp_path):
    A = bert(16, 2, 0)
    seq_cls_adapter(A, tmp_path / "ad")
    cfg = transformers.MPNetConfig(vocab_size=34, hidden_size=24, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=48, max_position_embeddings=24, num_labels=3)
    torch.manual_seed(1)
    B = transformers.MPNetForSequenceClassification(cfg).eval()
    src = batches()
    tgt = [{**b, "input_ids": b["input_ids"] + 4} for b in src]
    res = fit_transfer(A, tmp_path / "ad", B, source_batches=src, target_batches=tgt, loss=hf_loss,
                       options=TransferOptions(vocab_map=[-1] * 4 + list(range(30))))
    assert list(res.heads.target) == ["classifier.dense", "classifier.out_proj"]
    model = res.model(B)
    torch.testing.assert_close(model.classifier.dense.weight, torch.eye(24))
    assert float(model.classifier.dense.bias.abs().max()) == 0
    assert TaskVector({"w": model.classifier.out_proj.weight - B.classifier.out_proj.weight}).norm() > 0


def test_head_batches_refit_the_head_on_their_own_rows(tmp_path):
    A, B = bert(16, 2, 0), bert(24, 2, 1)
    seq_cls_adapter(A, tmp_path / "ad")
    cal, extra = batches(), batches(seed=11, n=6)
    plain = fit_transfer(A, tmp_path / "ad", B, cal, hf_loss)
    # the calibration batches given again as head batches: the same transfer, bit for bit
    same = fit_transfer(A, tmp_path / "ad", B, cal, hf_loss, head_batches=cal)
    for k, v in plain.task_vector.items():
        assert torch.equal(v, same.task_vector[k]), k
    assert torch.equal(plain.model(B).classifier.weight, same.model(B).classifier.weight)
    # other head batches: the written head is the closed-form fit on B + tau_B's rows of those batches
    res = fit_transfer(A, tmp_path / "ad", B, cal, hf_loss, head_batches=extra)
    assert res.heads is not None and res.heads.used == "refit" and res.report()["heads"]["head_data"] is True
    assert res.report()["heads"]["calibration_head"]["rows"] == 6 * 8
    for alpha in (0.0, 1.0):
        model = res.model(B, alpha)
        ref = res.task_vector.apply(B, alpha)
        rows: list[torch.Tensor] = []
        ref.classifier.register_forward_hook(lambda m, inp, out, rows=rows: rows.append(inp[0].detach()))
        with torch.no_grad():
            for bt in extra:
                ref(input_ids=bt["input_ids"])
        W, b, _ = fit_linear_head(torch.cat(rows), torch.cat([bt["labels"] for bt in extra]), 3)
        torch.testing.assert_close(model.classifier.weight.double(), W, atol=1e-5, rtol=0)
        torch.testing.assert_close(model.classifier.bias.double(), b, atol=1e-5, rtol=0)
    assert (res.model(B).classifier.weight - plain.model(B).classifier.weight).abs().max() > 1e-4
    with pytest.raises(ValueError, match="head_batches is empty"):
        fit_transfer(A, tmp_path / "ad", B, cal, hf_loss, head_batches=[])


def test_the_head_at_alpha_0_reuses_the_calibration_fit_and_equals_a_fresh_one(tmp_path, monkeypatch):
    import ftlab.transfer.heads as heads_mod

    A, B = bert(16, 2, 0), bert(24, 2, 1)
    seq_cls_adapter(A, tmp_path / "ad")
    res = fit_transfer(A, tmp_path / "ad", B, batches(), hf_loss, head_batches=batches(seed=11, n=4))
    calls = []
    fit = heads_mod.fit_linear_head
    monkeypatch.setattr(heads_mod, "fit_linear_head", lambda *a, **k: calls.append(1) or fit(*a, **k))
    at0 = res.model(B, 0.0).classifier
    assert calls == []  # B's own rows at alpha 0 are the calibration head's rows: no second fit
    res.heads.fitted = None  # the same head fitted again from scratch
    again = res.model(B, 0.0).classifier
    assert calls == [1]
    assert torch.equal(at0.weight, again.weight) and torch.equal(at0.bias, again.bias)
    res.model(B, 1.0)
    assert calls == [1, 1]
