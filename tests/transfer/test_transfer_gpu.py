"""The GPU path: with the models on a CUDA device, statistics and solves stay there and give the CPU's answer.

Marked ``gpu`` (skipped where no CUDA device exists; CI has none): ``pytest -m gpu tests/transfer``.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ftlab.transfer import TaskVector, fit_transfer
from ftlab.transfer.factored import LowRankMap

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::ftlab.transfer.align.RankWarning"),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
DT = torch.float64


class Net(nn.Module):
    """Conv + BatchNorm + depthwise + a 320-wide MLP: dense maps, kept rows and factored solves in one model."""

    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.fc1, self.fc2 = nn.Linear(16, 320), nn.Linear(320, 320)
        self.out = nn.Linear(320, 4)

    def forward(self, x):
        h = torch.relu(self.dw(torch.relu(self.bn(self.conv(x))))).mean((2, 3))
        return self.out(torch.tanh(self.fc2(torch.tanh(self.fc1(h)))))


def ce(model, batch):
    return nn.functional.cross_entropy(model(batch[0]), batch[1])


def _setup():
    A, B = Net(0).double().eval(), Net(1).double().eval()
    A_ft = copy.deepcopy(A)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in A_ft.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=g, dtype=DT))
    batches = [(torch.randn(16, 3, 6, 6, generator=g, dtype=DT), torch.randint(0, 4, (16,), generator=g))
               for _ in range(3)]
    return A, A_ft, B, batches


def test_a_transfer_on_the_gpu_keeps_statistics_and_maps_there_and_matches_the_cpu():
    A, A_ft, B, batches = _setup()
    cpu = fit_transfer(A, A_ft, B, batches, ce)
    dev = torch.device("cuda")
    gpu_batches = [(x.to(dev), y.to(dev)) for x, y in batches]
    res = fit_transfer(A.to(dev), A_ft.to(dev), B.to(dev), gpu_batches, ce)
    fits = [f for pair in res.fits.values() for f in pair if f is not None]
    assert any(isinstance(f.R, LowRankMap) for f in fits)  # the 320-wide maps from 48 rows: factored
    for f in fits:
        assert (f.R.device if isinstance(f.R, LowRankMap) else f.R.device).type == "cuda", f.name
    diff = TaskVector({k: res.task_vector[k] - cpu.task_vector[k] for k in cpu.task_vector})
    assert diff.norm() < 1e-8 * cpu.task_vector.norm()
