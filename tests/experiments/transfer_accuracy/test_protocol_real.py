"""Protocol pieces of the real-pair benchmark: calibration sets, frozen BatchNorm statistics, image preprocessing,
the permuted copy of the controlled family, calibration losses."""

import numpy as np
import pytest
import torch
from torch import nn

from ftlab.experiments.transfer_accuracy.compare import calibration_batches
from ftlab.experiments.transfer_accuracy.family import permuted_copy
from ftlab.experiments.transfer_accuracy.finetune import finetune, recipe, task_loss
from ftlab.experiments.transfer_accuracy.probe import ProbeClassifier
from ftlab.experiments.transfer_accuracy.vision import to_imagenet_rgb
from ftlab.models.vit import ViT


def test_five_per_class_calibration_is_stratified_and_deterministic():
    y = torch.tensor([c for c in range(4) for _ in range(30)])
    x = torch.arange(len(y)).float().view(-1, 1)
    a = calibration_batches(x, y, kind="k5", seed=3, batch_size=8)
    b = calibration_batches(x, y, kind="k5", seed=3, batch_size=8)
    labels = torch.cat([t[1] for t in a])
    assert sorted(np.bincount(labels.numpy()).tolist()) == [5, 5, 5, 5]
    assert all(torch.equal(p[0], q[0]) for p, q in zip(a, b))
    idx = torch.cat([t[0] for t in a]).view(-1).long()
    assert len(set(idx.tolist())) == 20 and torch.equal(y[idx], labels)
    c = calibration_batches(x, y, kind="k5", seed=4, batch_size=8)
    assert not torch.equal(torch.cat([t[0] for t in c]), torch.cat([t[0] for t in a]))
    n = calibration_batches(x, y, kind="n100", seed=0, batch_size=32)
    assert [len(t[1]) for t in n] == [32, 32, 32, 4]


class _ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def features(self, x):
        return torch.relu(self.bn(self.conv(x))).mean((2, 3))


def test_fine_tuning_keeps_batchnorm_statistics_and_the_head():
    torch.manual_seed(0)
    enc = _ConvNet().eval()
    with torch.no_grad():
        enc.bn.running_mean.normal_()
        enc.bn.running_var.uniform_(0.5, 2)
    model = ProbeClassifier(enc, nn.Linear(4, 2)).eval()
    x, y = torch.randn(32, 1, 6, 6), torch.randint(0, 2, (32,))
    ft = finetune(model, x, y, range(2), config=recipe(lr=0.1, epochs=2, batch_size=8), seed=0)
    assert torch.equal(ft.encoder.bn.running_mean, enc.bn.running_mean)
    assert torch.equal(ft.encoder.bn.running_var, enc.bn.running_var)
    assert torch.equal(ft.head.weight, model.head.weight)
    assert not torch.equal(ft.encoder.conv.weight, enc.conv.weight)
    model.train()
    assert not model.encoder.bn.training and model.encoder.conv.training


def test_imagenet_rgb_preprocessing():
    img = np.zeros((2, 28, 28), dtype=np.float32)
    img[1] = 1.0
    t = to_imagenet_rgb(img, 32)
    assert t.shape == (2, 3, 32, 32)
    mean, std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
    torch.testing.assert_close(t[0, :, 5, 5], -mean / std)
    torch.testing.assert_close(t[1, :, 5, 5], (1 - mean) / std)


def test_permuted_copy_is_the_same_function_in_other_coordinates():
    torch.manual_seed(0)
    m = ViT(image_size=8, patch=4, width=8, depth=2, heads=2, n_classes=5).eval()
    p = permuted_copy(m, seed=1).eval()
    x = torch.randn(6, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(p(x), m(x), rtol=1e-5, atol=1e-5)
    moved = sum(not torch.equal(a, b) for a, b in zip(m.state_dict().values(), p.state_dict().values()))
    assert moved >= 10
    # the same multiset of weights per tensor: a pure renaming of units
    for k, v in m.state_dict().items():
        torch.testing.assert_close(v.flatten().sort().values, p.state_dict()[k].flatten().sort().values)


@pytest.mark.parametrize("kind", ["ce", "logit", "pseudo"])
def test_calibration_losses(kind):
    torch.manual_seed(0)
    model = nn.Linear(3, 5)
    x, y = torch.randn(10, 3), torch.randint(0, 2, (10,))
    loss = task_loss((1, 3), kind)
    v = loss(model, (x, y))
    assert v.ndim == 0 and torch.isfinite(v)
    z = model(x)[:, [1, 3]]
    if kind == "logit":
        torch.testing.assert_close(v, -(z.gather(1, y[:, None]).squeeze(1) - z.mean(1)).mean())
    if kind == "pseudo":  # labels are ignored
        torch.testing.assert_close(v, loss(model, (x, 1 - y)))
    with pytest.raises(ValueError, match="loss"):
        task_loss((1, 3), "hinge")
