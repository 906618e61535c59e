"""The simplest models transfer with the default options: plain ``nn.Sequential`` stacks (with and without
activations, any widths, other depths), layers at a model's top level, and a stack nested in a module.

Planted answers: B is an exact re-coding of A with wider hidden layers (a general isometric embedding
for linear stacks; a permutation plus dead units where an elementwise nonlinearity sits in between),
so the fine-tuning B would receive is known: ``tau_B`` follows from ``tau_A`` through the same maps.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ftlab.transfer import TaskVector, fit_transfer, transfer
from transfer_helpers import perturbed

DT = torch.float64
pytestmark = pytest.mark.filterwarnings("ignore::ftlab.transfer.align.RankWarning")


def batches(d_in: int, d_out: int, n: int = 4, rows: int = 32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(rows, d_in, generator=g, dtype=DT), torch.randn(rows, d_out, generator=g, dtype=DT))
            for _ in range(n)]


def mse(model, batch):
    return (model(batch[0]) - batch[1]).pow(2).mean()


def rel_err(tv, truth) -> float:
    return (TaskVector({k: tv[k] - truth[k] for k in tv}).norm()) / truth.norm()


def isometry(d_a: int, d_b: int, seed: int) -> torch.Tensor:
    """A ``d_a x d_b`` map with orthonormal rows (an isometric embedding of A's space in B's)."""
    q, _ = torch.linalg.qr(torch.randn(d_b, d_b, generator=torch.Generator().manual_seed(seed), dtype=DT))
    return q[:, :d_a].T.contiguous()


def embed_linear(model: nn.Sequential, maps: list[torch.Tensor]) -> nn.Sequential:
    """B computing A's function: layer l of B = E_l^T W_l E_{l-1} (E_{-1} = E_last = identity)."""
    layers = [m for m in model if isinstance(m, nn.Linear)]
    eye_in = torch.eye(layers[0].in_features, dtype=DT)
    eye_out = torch.eye(layers[-1].out_features, dtype=DT)
    E = [eye_in, *maps, eye_out]
    out = []
    for i, lin in enumerate(layers):
        new = nn.Linear(E[i].shape[1], E[i + 1].shape[1]).double()
        with torch.no_grad():
            new.weight.copy_(E[i + 1].T @ lin.weight @ E[i])
            new.bias.copy_(E[i + 1].T @ lin.bias)
        out.append(new)
    kids = iter(out)
    return nn.Sequential(*[next(kids) if isinstance(m, nn.Linear) else copy.deepcopy(m) for m in model])


def carried(tau: TaskVector, model: nn.Sequential, maps: list[torch.Tensor]) -> TaskVector:
    """The planted answer: tau through the same embeddings, keyed by B's names (= A's names here)."""
    idx = [i for i, m in enumerate(model) if isinstance(m, nn.Linear)]
    d_in, d_out = model[idx[0]].in_features, model[idx[-1]].out_features
    E = [torch.eye(d_in, dtype=DT), *maps, torch.eye(d_out, dtype=DT)]
    out = {}
    for k, i in enumerate(idx):
        out[f"{i}.weight"] = E[k + 1].T @ tau[f"{i}.weight"] @ E[k]
        out[f"{i}.bias"] = E[k + 1].T @ tau[f"{i}.bias"]
    return TaskVector(out)


def test_the_sequential_stack_of_the_report_transfers_with_default_options():
    torch.manual_seed(0)
    A = nn.Sequential(nn.Linear(24, 24), nn.Linear(24, 24), nn.Linear(24, 32)).double()
    B = nn.Sequential(nn.Linear(24, 32), nn.Linear(32, 36), nn.Linear(36, 32)).double()
    res = fit_transfer(A, perturbed(A, 1), B, batches(24, 32), mse)
    assert res.layer_map == {"": [0, 1, 2]}
    assert {k: tuple(v.shape) for k, v in res.task_vector.items()} == {k: tuple(v.shape) for k, v in B.state_dict().items()}
    assert all(torch.isfinite(v).all() for v in res.task_vector.values())


@pytest.mark.parametrize("widths", [(6, 6), (6, 10), (10, 12)], ids=["same", "wider", "wider-twice"])
def test_a_linear_stack_recoded_with_wider_hidden_layers_is_recovered_exactly(widths):
    torch.manual_seed(1)
    A = nn.Sequential(nn.Linear(8, 6), nn.Linear(6, 6), nn.Linear(6, 3)).double()
    maps = [isometry(6, widths[0], 3), isometry(6, widths[1], 4)]
    B = embed_linear(A, maps)
    x = torch.randn(5, 8, dtype=DT)
    torch.testing.assert_close(B(x), A(x))  # B computes A's function
    A_ft = perturbed(A, 2)
    truth = carried(TaskVector.from_models(A, A_ft), A, maps)
    assert rel_err(transfer(A, A_ft, B, batches(8, 3), mse), truth) < 1e-8


def test_a_tanh_mlp_with_wider_hidden_layers_permuted_and_dead_units_is_recovered_exactly():
    torch.manual_seed(2)
    A = nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 7), nn.Tanh(), nn.Linear(7, 2)).double()
    maps = []
    for (d_a, d_b), seed in (((6, 9), 5), ((7, 11), 6)):
        perm = torch.randperm(d_b, generator=torch.Generator().manual_seed(seed))[:d_a]
        E = torch.zeros(d_a, d_b, dtype=DT)
        E[torch.arange(d_a), perm] = 1.0  # unit a of A is unit perm[a] of B; the other units of B are dead
        maps.append(E)
    B = embed_linear(A, maps)
    x = torch.randn(5, 5, dtype=DT)
    torch.testing.assert_close(B(x), A(x))
    A_ft = perturbed(A, 3)
    truth = carried(TaskVector.from_models(A, A_ft), A, maps)
    res = fit_transfer(A, A_ft, B, batches(5, 2), mse)
    assert res.layer_map == {"": [0, 1, 2]}  # the stack skips the activations
    assert rel_err(res.task_vector, truth) < 1e-8


class TopLevel(nn.Module):
    """Layers as attributes of the model itself: no stack at all."""

    def __init__(self, h: int, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1, self.fc2, self.fc3 = nn.Linear(4, h), nn.Linear(h, h), nn.Linear(h, 2)

    def forward(self, x):
        return self.fc3(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))))


class Nested(nn.Module):
    """A Sequential stack nested inside a module, with a head outside it."""

    def __init__(self, widths, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        dims = (4, *widths)
        self.body = nn.Sequential(*[m for i in range(len(widths)) for m in (nn.Linear(dims[i], dims[i + 1]), nn.ReLU())])
        self.head = nn.Linear(widths[-1], 2)

    def forward(self, x):
        return self.head(self.body(x))


def _permuted_copy(model: nn.Module, names: list[tuple[str, str]], width: int, seed: int):
    """B = A with hidden units permuted between layer ``first`` and ``second`` of each pair; the planted tau_B."""
    perm = torch.randperm(width, generator=torch.Generator().manual_seed(seed))
    B = copy.deepcopy(model)
    sd = B.state_dict()
    with torch.no_grad():
        for first, second in names:
            sd[f"{first}.weight"].copy_(sd[f"{first}.weight"][perm])
            sd[f"{first}.bias"].copy_(sd[f"{first}.bias"][perm])
            sd[f"{second}.weight"].copy_(sd[f"{second}.weight"][:, perm])
    return B, perm


def test_layers_at_the_top_level_of_a_model_transfer_exactly_to_a_permuted_copy():
    A = TopLevel(6, 0).double()
    B, perm = _permuted_copy(A, [("fc1", "fc2")], 6, 1)
    A_ft = perturbed(A, 2)
    tau = TaskVector.from_models(A, A_ft)
    truth = dict(tau.items())
    truth["fc1.weight"], truth["fc1.bias"] = tau["fc1.weight"][perm], tau["fc1.bias"][perm]
    truth["fc2.weight"] = tau["fc2.weight"][:, perm]
    assert rel_err(transfer(A, A_ft, B, batches(4, 2), mse), TaskVector(truth)) < 1e-8


def test_a_stack_nested_in_a_module_maps_by_depth_and_recovers_a_permuted_copy():
    A = Nested((6, 6, 6), 0).double()
    res = fit_transfer(A, perturbed(A, 1), Nested((6, 8, 6, 6), 3).double(), batches(4, 2), mse)
    assert res.layer_map == {"body": [0, 1, 1, 2]}  # 3 -> 4 blocks by relative depth; ReLUs skipped
    assert set(res.task_vector) == set(Nested((6, 8, 6, 6), 3).state_dict())
    B, perm = _permuted_copy(A, [("body.0", "body.2")], 6, 4)
    A_ft = perturbed(A, 5)
    tau = TaskVector.from_models(A, A_ft)
    truth = dict(tau.items())
    truth["body.0.weight"], truth["body.0.bias"] = tau["body.0.weight"][perm], tau["body.0.bias"][perm]
    truth["body.2.weight"] = tau["body.2.weight"][:, perm]
    assert rel_err(transfer(A, A_ft, B, batches(4, 2), mse), TaskVector(truth)) < 1e-8


def test_a_deeper_sequential_target_takes_source_layers_by_relative_depth():
    torch.manual_seed(0)
    A = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3)).double()
    B = nn.Sequential(*[m for i in range(4) for m in (nn.Linear(6 if i == 0 else 10, 10), nn.ReLU())],
                      nn.Linear(10, 3)).double()
    res = fit_transfer(A, perturbed(A, 1), B, batches(6, 3), mse)
    assert res.layer_map == {"": [0, 1, 1, 1, 2]}
    assert res.options["transfer"]["depth_map"] == "stage_relative"
    # B's first and last layers receive A's first and last (their deltas carry over with no loss of norm)
    tau = TaskVector.from_models(A, perturbed(A, 1))
    assert res.task_vector["8.weight"].norm() == pytest.approx(float(tau["4.weight"].norm()), rel=1e-6)
