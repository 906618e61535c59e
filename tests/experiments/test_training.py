"""The one training loop and evaluation function of the experiments."""

import math

import pytest
import torch

from ftlab.experiments.training import TrainConfig, _lr_at, accuracy, train_


def _data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 5, generator=g)
    return X, (X[:, 0] > 0).long()


def test_training_reaches_tolerance_on_separable_data():
    torch.manual_seed(0)
    X, y = _data()
    model = torch.nn.Linear(5, 2)
    res = train_(model, X, y, config=TrainConfig(lr=0.5, max_steps=2000, batch_size=64, loss_tol=0.05), seed=0)
    assert res.converged and res.residual < 0.05 and res.n_iter < 2000
    assert accuracy(model, X, y) == 1.0


def test_step_budget_drop_last_and_epochs():
    X, y = _data(50)
    m = torch.nn.Linear(5, 2)
    r = train_(m, X, y, config=TrainConfig(lr=0.01, epochs=3, batch_size=16, drop_last=True))
    assert (r.n_iter, r.epochs) == (3 * 3, 3)
    r = train_(m, X, y, config=TrainConfig(lr=0.01, epochs=3, batch_size=16))
    assert (r.n_iter, r.epochs) == (3 * 4, 3)
    r = train_(m, X, y, config=TrainConfig(lr=0.01, epochs=3, max_steps=5, batch_size=16))
    assert r.n_iter == 5 and r.epochs == 2


def test_same_seed_same_weights_other_seed_other_weights():
    X, y = _data()
    out = []
    for seed, order in ((1, "numpy"), (1, "numpy"), (2, "numpy"), (1, "torch")):
        torch.manual_seed(0)
        m = torch.nn.Linear(5, 2)
        train_(m, X, y, config=TrainConfig(lr=0.1, epochs=2, batch_size=8, order=order), seed=seed)
        out.append(m.weight.detach().clone())
    assert torch.equal(out[0], out[1]) and not torch.equal(out[0], out[2]) and not torch.equal(out[0], out[3])


def test_frozen_prefixes_stay_fixed_and_flags_are_restored():
    X, y = _data()
    m = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    m[2].weight.requires_grad_(False)
    before = [p.detach().clone() for p in m.parameters()]
    train_(m, X, y, config=TrainConfig(lr=0.1, epochs=2, batch_size=16, frozen=("2",)))
    after = list(m.parameters())
    assert not torch.equal(before[0], after[0]) and torch.equal(before[2], after[2]) and torch.equal(before[3], after[3])
    assert [p.requires_grad for p in m.parameters()] == [True, True, False, True] and not m.training


def test_warmup_cosine_schedule_is_linear_then_cosine():
    cfg = TrainConfig(lr=1.0, epochs=1, schedule="warmup_cosine")
    lrs = [_lr_at(cfg, s, 200) for s in range(200)]
    assert lrs[:10] == pytest.approx([(s + 1) / 10 for s in range(10)])  # 5% of 200 steps of warm-up
    assert lrs[10] == pytest.approx(1.0) and lrs[-1] == pytest.approx(0.5 * (1 + math.cos(math.pi * 189 / 190)))
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))


def test_divergence_is_reported_not_hidden():
    X, y = _data()
    m = torch.nn.Linear(5, 2)
    with torch.no_grad():
        m.weight.fill_(float("nan"))
    r = train_(m, X, y, config=TrainConfig(lr=0.1, epochs=2))
    assert not r.converged and r.residual == math.inf and r.n_iter == 0


def test_accuracy_through_a_subset_of_classes_and_dict_inputs():
    class Pick(torch.nn.Module):
        def forward(self, batch):
            return batch["x"]

    logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 2.0], [0.0, 1.0, 4.0]])
    # through classes (0, 2): rows predict 2, 0, 2 -> task labels 1, 0, 1
    assert accuracy(Pick(), {"x": logits}, torch.tensor([1, 0, 1]), classes=(0, 2), batch_size=2) == 1.0
    assert accuracy(Pick(), {"x": logits}, torch.tensor([1, 0, 1])) == pytest.approx(2 / 3)  # argmax 1, 0, 2


@pytest.mark.parametrize("bad", [dict(lr=0.0, epochs=1), dict(lr=0.1), dict(lr=0.1, epochs=0),
                                 dict(lr=0.1, epochs=1, optimizer="adam"), dict(lr=0.1, epochs=1, batch_size=0)])
def test_bad_recipes_are_refused(bad):
    with pytest.raises(ValueError):
        TrainConfig(**bad)
