"""Text pieces on a tiny random BERT: masked pooling, the folded linear probe equals sklearn's, fixed task splits."""

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("sklearn")

from ftlab.experiments.transfer_accuracy.probe import ProbeClassifier, encode, fit_probe_head  # noqa: E402
from ftlab.experiments.transfer_accuracy.text import TextEncoder, load_text_task  # noqa: E402


def _tiny_bert():
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=40, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=16, max_position_embeddings=16)
    return TextEncoder(transformers.BertModel(cfg, add_pooling_layer=False).eval())


def _inputs(n, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 40, (n, 6), generator=g)
    mask = torch.ones(n, 6, dtype=torch.long)
    mask[: n // 2, 4:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def test_masked_mean_pooling_ignores_padding():
    enc = _tiny_bert()
    x = _inputs(4, 0)
    changed = {k: v.clone() for k, v in x.items()}
    changed["input_ids"][:2, 4:] = 7  # only padded positions change
    np.testing.assert_allclose(encode(enc.features, x)[:2], encode(enc.features, changed)[:2], rtol=1e-5, atol=1e-6)


def test_folded_probe_equals_sklearn_decision_function():
    from sklearn.linear_model import LogisticRegression

    enc = _tiny_bert()
    x = _inputs(60, 1)
    y = np.arange(60) % 3
    head = fit_probe_head(enc, x, y, c=1.0)
    f = encode(enc.features, x)
    mu = f.mean(0)
    sd = float(np.sqrt(((f - mu) ** 2).sum(1).mean()))
    ref = LogisticRegression(C=1.0, max_iter=3000).fit((f - mu) / sd, y).decision_function((f - mu) / sd)
    with torch.no_grad():
        got = ProbeClassifier(enc, head)(x).double().numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_two_class_and_missing_class_probes():
    enc = _tiny_bert()
    x = _inputs(40, 2)
    y = np.arange(40) % 2
    head = fit_probe_head(enc, x, y, n_classes=3)  # class 2 never seen: never predicted
    with torch.no_grad():
        z = ProbeClassifier(enc, head)(x)
    assert z.shape == (40, 3) and bool((z.argmax(1) != 2).all())
    # two classes: the two rows give sklearn's binary posterior
    from sklearn.linear_model import LogisticRegression

    f = encode(enc.features, x)
    mu, sd = f.mean(0), float(np.sqrt(((f - f.mean(0)) ** 2).sum(1).mean()))
    p = LogisticRegression(C=1.0, max_iter=3000).fit((f - mu) / sd, y).predict_proba((f - mu) / sd)[:, 1]
    np.testing.assert_allclose(torch.softmax(z[:, :2].double(), 1)[:, 1].numpy(), p, rtol=1e-4, atol=1e-4)


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
    for i in range(90):
        lex = (29, 30, 35, 38, 32, 41, 40, 42)[i % 8] if i < 86 else 43
        lines.append(f"{i:08d} {lex:02d} v 01 word{i} 0 000 | gloss number {i} of class {lex}  \n")
    p = tmp_path / "data.verb"
    p.write_text("  1 license line  \n" + "".join(lines))
    a = load_text_task("wordnet_verbs", _Tok(), n_train=20, n_val=10, n_test=12, max_length=8, seed=0, wordnet_path=p)
    b = load_text_task("wordnet_verbs", _Tok(), n_train=20, n_val=10, n_test=12, max_length=8, seed=1, wordnet_path=p)
    assert len(a.classes) == 8 and "verb.weather" not in a.classes  # the 8 frequent ones; the rare 9th dropped
    assert torch.equal(a.x_test["input_ids"], b.x_test["input_ids"])
    assert torch.equal(a.x_val["input_ids"], b.x_val["input_ids"])
    assert not torch.equal(a.x_train["input_ids"], b.x_train["input_ids"])
    held = {tuple(r.tolist()) for part in (a.x_val, a.x_test) for r in part["input_ids"]}
    assert not any(tuple(r.tolist()) in held for r in a.x_train["input_ids"])
    with pytest.raises(ValueError, match="out of range"):
        load_text_task("wordnet_verbs", _Tok(), n_train=80, n_val=10, n_test=12, wordnet_path=p)
