"""The zero-shot head protocol, the shifted tasks and the fine-tuning recipe on tiny models."""

import numpy as np
import pytest
import torch

from ftlab.data import DatasetMissing
from ftlab.experiments.training import accuracy
from ftlab.experiments.transfer_accuracy.finetune import batches_of, finetune, recipe, task_loss
from ftlab.experiments.transfer_accuracy.tasks import TASKS, _apply_shift, load_task
from ftlab.models.vit import ViT


def _tiny(seed=0, n_classes=6):
    torch.manual_seed(seed)
    return ViT(image_size=8, patch=4, width=8, depth=1, heads=2, n_classes=n_classes)


def test_accuracy_reads_only_the_task_rows_of_the_head():
    m = _tiny()
    x = torch.randn(40, 8, 8)
    classes = (4, 1, 5)
    with torch.no_grad():
        logits = m(x)
    # planted labels: the argmax among the task's rows, so accuracy must be exactly 1
    y = logits[:, list(classes)].argmax(1)
    assert accuracy(m, x, y, classes=classes) == 1.0
    # a different class order reads different rows: accuracy equals the manual count
    y2 = torch.zeros(40, dtype=torch.long)
    manual = float((logits[:, [1, 4, 5]].argmax(1) == 0).float().mean())
    assert accuracy(m, x, y2, classes=(1, 4, 5)) == pytest.approx(manual)


def test_finetune_keeps_head_and_input_model_and_lowers_loss():
    m = _tiny()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, 8, generator=g)
    y = (x[:, :4, :4].mean((1, 2)) > 0).long()  # learnable rule
    classes = (2, 3)
    loss = task_loss(classes)
    cfg = recipe(optimizer="sgd", lr=0.05, epochs=10, batch_size=16)
    ft = finetune(m, x, y, classes, config=cfg, seed=0)
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), f"input model changed at {k}"
    torch.testing.assert_close(ft.head.weight, m.head.weight, rtol=0, atol=0)
    with torch.no_grad():
        assert float(loss(ft, (x, y))) < float(loss(m, (x, y)))
    assert any(not torch.equal(ft.state_dict()[k], before[k]) for k in before if not k.startswith("head"))


def test_finetune_is_deterministic_given_seed():
    m = _tiny()
    x, y = torch.randn(32, 8, 8), torch.randint(0, 2, (32,))
    cfg = recipe(epochs=2, batch_size=8)
    a = finetune(m, x, y, (0, 1), config=cfg, seed=3)
    b = finetune(m, x, y, (0, 1), config=cfg, seed=3)
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())


def test_batches_of_draws_without_replacement():
    x, y = torch.arange(50).float().view(50, 1), torch.arange(50)
    bs = batches_of(x, y, batch_size=8, n=30, seed=1)
    seen = torch.cat([b[1] for b in bs])
    assert len(seen) == 30 and len(set(seen.tolist())) == 30 and [len(b[1]) for b in bs] == [8, 8, 8, 6]
    assert all(torch.equal(b[0].view(-1).long(), b[1]) for b in bs)
    with pytest.raises(ValueError, match="n=51"):
        batches_of(x, y, batch_size=8, n=51)


def test_shifts():
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(3, 28, 28)).astype(np.float32)
    r = _apply_shift(x, "rot90", rng)
    np.testing.assert_array_equal(_apply_shift(_apply_shift(_apply_shift(r, "rot90", rng), "rot90", rng), "rot90", rng), x)
    np.testing.assert_array_equal(_apply_shift(x, "rot180", rng), x[:, ::-1, ::-1])
    np.testing.assert_array_equal(_apply_shift(x, "invert", rng), -x)
    noisy = _apply_shift(x, "noise", rng)
    assert noisy.min() >= -1 and noisy.max() <= 1 and not np.allclose(noisy, x)


def test_task_classes_map_into_the_joint_head():
    assert TASKS["mnist_rot90"].joint_classes == tuple(range(10, 20))
    assert TASKS["fashion_invert"].joint_classes == tuple(range(10))
    assert TASKS["fashion_tops_rot180"].joint_classes == (0, 2, 4, 6)
    assert len(TASKS) >= 4


def test_task_splits_fixed_and_disjoint_across_seeds():
    try:
        a = load_task("fashion_tops_rot180", n_train=50, n_val=20, n_test=30, seed=0)
        b = load_task("fashion_tops_rot180", n_train=50, n_val=20, n_test=30, seed=1)
    except DatasetMissing as exc:
        pytest.skip(str(exc))
    np.testing.assert_array_equal(a.x_val, b.x_val)
    np.testing.assert_array_equal(a.x_test, b.x_test)
    assert not np.array_equal(a.x_train, b.x_train)
    assert set(np.unique(a.y_train)) <= {0, 1, 2, 3}
    flat_val = {v.tobytes() for v in a.x_val}
    assert not any(t.tobytes() in flat_val for t in np.concatenate([a.x_train, b.x_train]))


def test_small_pool_gives_fewer_validation_images_never_overlapping():
    d = load_task("digits", n_train=1000, n_val=500, n_test=10, seed=0)
    assert len(d.x_train) == 1000 and len(d.x_val) == 1258 - 1000
    flat_val = {v.tobytes() for v in d.x_val}
    assert not any(t.tobytes() in flat_val for t in d.x_train)
    with pytest.raises(ValueError, match="n_train=1258 is out of range"):
        load_task("digits", n_train=1258, n_val=10, n_test=10)
