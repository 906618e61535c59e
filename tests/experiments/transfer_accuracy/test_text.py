"""Text pieces on a tiny random BERT: the folded linear probe equals sklearn's, the task splits are fixed."""

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("sklearn")

from ftlab.experiments.transfer_accuracy.text import TextClassifier, _logreg, features, fit_probe, load_text_task  # noqa: E402


def _tiny_bert():
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=40, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=16, max_position_embeddings=16)
    return transformers.BertModel(cfg, add_pooling_layer=False).eval()


def _inputs(n, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 40, (n, 6), generator=g)
    mask = torch.ones(n, 6, dtype=torch.long)
    mask[: n // 2, 4:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def test_masked_mean_pooling_ignores_padding():
    bert = _tiny_bert()
    x = _inputs(4, 0)
    changed = {k: v.clone() for k, v in x.items()}
    changed["input_ids"][:2, 4:] = 7  # only padded positions change
    np.testing.assert_allclose(features(bert, x)[:2], features(bert, changed)[:2], rtol=1e-5, atol=1e-6)


def test_folded_probe_equals_sklearn_decision_function():
    bert = _tiny_bert()
    x = _inputs(60, 1)
    y = np.arange(60) % 3
    head = fit_probe(bert, x, y, c=1.0)
    clf, mu, sd = _logreg(features(bert, x), y, 1.0)
    ref = clf.decision_function((features(bert, x) - mu) / sd)
    with torch.no_grad():
        got = TextClassifier(bert, head)(x).double().numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


class _Tok:
    """Whitespace tokenizer with the Hugging Face call signature used by load_text_task."""

    def __call__(self, texts, padding, truncation, max_length, return_tensors):
        ids = torch.zeros(len(texts), max_length, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, t in enumerate(texts):
            toks = [int(w) + 100 if w.isdigit() else len(w) for w in t.split()][:max_length]
            ids[i, :len(toks)] = torch.tensor(toks)
            mask[i, :len(toks)] = 1
        return {"input_ids": ids, "attention_mask": mask}


def test_text_task_splits(tmp_path):
    lines = []
    for i in range(60):
        lex = (5, 6, 18)[i % 3] if i < 54 else 20
        lines.append(f"{i:08d} {lex:02d} n 01 word{i} 0 000 | gloss number {i} of class {lex}  \n")
    p = tmp_path / "data.noun"
    p.write_text("  1 license line  \n" + "".join(lines))
    a = load_text_task(_Tok(), n_classes=3, n_probe=6, n_train=10, n_val=6, n_test=12, max_length=8, seed=0, wordnet_path=p)
    b = load_text_task(_Tok(), n_classes=3, n_probe=6, n_train=10, n_val=6, n_test=12, max_length=8, seed=1, wordnet_path=p)
    assert a.classes == ("noun.animal", "noun.artifact", "noun.person")  # the 3 frequent ones; noun.plant dropped
    assert torch.equal(a.test_inputs["input_ids"], b.test_inputs["input_ids"])
    assert torch.equal(a.probe_inputs["input_ids"], b.probe_inputs["input_ids"])
    assert not torch.equal(a.train_inputs["input_ids"], b.train_inputs["input_ids"])
    held = {tuple(r.tolist()) for part in (a.probe_inputs, a.val_inputs, a.test_inputs) for r in part["input_ids"]}
    assert not any(tuple(r.tolist()) in held for r in a.train_inputs["input_ids"])
    assert set(a.y_train.tolist()) <= {0, 1, 2}
    with pytest.raises(ValueError, match="n_classes=5"):
        load_text_task(_Tok(), n_classes=5, wordnet_path=p)
