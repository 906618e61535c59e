"""The short heal (:mod:`ftlab.transfer.heal`) with the model's dropout on and off, on a tiny BERT built from a config."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from ftlab.transfer.heal import HealRecipe, fresh_lora, heal_adapter  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


@pytest.fixture
def setup(tmp_path):
    cfg = transformers.BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=16, num_labels=3,
                                  hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.3)
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(cfg).eval()
    (tmp_path / "a").mkdir()
    fresh_lora(model, tmp_path / "a", r=2, target_modules=["query", "value"], modules_to_save=["classifier"], seed=1)
    g = torch.Generator().manual_seed(2)
    batch = {"input_ids": torch.randint(0, 30, (8, 6), generator=g), "labels": torch.randint(0, 3, (8,), generator=g)}
    return model, tmp_path / "a", [batch]


def _loss(model, batch):
    return model(**batch).loss


def _state(model):
    return {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}


def test_without_dropout_the_heal_is_gradient_descent_on_a_fixed_loss(setup):
    """Dropout off: the training loss is a fixed function, so small SGD steps lower it at every step, and the seed
    (which only draws dropout masks) changes nothing; dropout on: the seed changes the result."""
    model, adapter, batches = setup
    seen: list[float] = []

    def record(step, m):
        with torch.no_grad():
            seen.append(float(_loss(m, batches[0])))

    heal_adapter(model, adapter, batches, _loss, HealRecipe(5, lr=0.05, optimizer="sgd", clip=0, dropout=False),
                 callback=record)
    assert all(b < a for a, b in zip(seen, seen[1:])), seen
    runs = {(drop, seed): _state(heal_adapter(model, adapter, batches, _loss,
                                              HealRecipe(3, lr=1e-2, seed=seed, dropout=drop)))
            for drop in (False, True) for seed in (0, 1)}
    assert all(torch.equal(runs[(False, 0)][k], runs[(False, 1)][k]) for k in runs[(False, 0)])
    assert any(not torch.equal(runs[(True, 0)][k], runs[(True, 1)][k]) for k in runs[(True, 0)])


def test_a_heal_recipe_refuses_a_dropout_that_is_not_a_bool():
    with pytest.raises(ValueError, match="dropout='no' is invalid"):
        HealRecipe(1, dropout="no")  # type: ignore[arg-type]
