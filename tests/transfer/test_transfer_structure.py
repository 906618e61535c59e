"""The transfer library's inside: fitted objects, the registry, one options object (API, CLI, record),
module modes, and the options that change a fit (each checked against a property it must have)."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from ftlab.transfer import TaskVector, TransferOptions, fit_transfer, get_method, transfer
from ftlab.transfer.methods import FittedTransfer, list_methods, register
from ftlab.transfer.methods.procrustes import FittedMaps
from ftlab.transfer.options import cli_fields
from ftlab.transfer.spec import Rule
from transfer_helpers import perturbed

DT = torch.float64
ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.filterwarnings("ignore::ftlab.transfer.align.RankWarning")


def mlp(seed, h=6):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, h), nn.Tanh(), nn.Linear(h, 3)).double()


def shifted(model, seed, scale=0.1):
    return perturbed(model, seed, scale)


def data(n=3, rows=16, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(rows, d, generator=g, dtype=DT), torch.randint(0, 3, (rows,), generator=g)) for _ in range(n)]


def ce(model, batch):
    return nn.functional.cross_entropy(model(batch[0]), batch[1])


# -- fitted objects --------------------------------------------------------------------------------------


def test_prepare_returns_a_frozen_fitted_transfer_and_leaves_the_method_unchanged():
    m = get_method("bico")
    state = dict(vars(m))
    A, B1, B2 = mlp(0), mlp(1), mlp(2, h=9)
    r1 = fit_transfer(A, shifted(A, 5), B1, data(), ce, method=m)
    r2 = fit_transfer(A, shifted(A, 5), B2, data(), ce, method=m)  # the same method object, another problem
    assert vars(m) == state  # nothing stored on the method
    assert r1.task_vector["0.weight"].shape == (6, 4) and r2.task_vector["0.weight"].shape == (9, 4)
    # the fitted transfer behind a result is frozen and re-applies to another task vector of the same source
    fitted = r1.fitted
    assert isinstance(fitted, FittedTransfer) and isinstance(fitted, FittedMaps)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fitted.fits = {}  # type: ignore[misc]
    tau1 = TaskVector.from_models(A, shifted(A, 5))
    torch.testing.assert_close(fitted.apply(tau1)["0.weight"], r1.task_vector["0.weight"])
    tau2 = TaskVector.from_models(A, shifted(A, 6))
    twice = fitted.apply(tau1 + tau2)  # transport is linear in the task vector
    torch.testing.assert_close(twice["2.weight"], fitted.apply(tau1)["2.weight"] + fitted.apply(tau2)["2.weight"])


def test_baselines_prepare_without_statistics_and_gradfix_refuses_a_wrong_statistic():
    A = mlp(0)
    res = fit_transfer(A, shifted(A, 1), mlp(3), method="naive")
    assert res.fits == {} and res.n_batches == 0
    with pytest.raises(TypeError, match="gradfix needs the target's calibration gradients"):
        get_method("gradfix").prepare(None, {"not": "gradients"})  # type: ignore[arg-type]


# -- the registry ----------------------------------------------------------------------------------------


def test_builtin_methods_are_registered_on_import_and_their_names_cannot_be_taken():
    names = [i.name for i in list_methods()]
    assert names[:3] == ["naive", "identity", "gradfix"] and "bico" in names

    @dataclasses.dataclass(frozen=True)
    class Opts:
        pass

    with pytest.raises(ValueError, match="'bico' is already registered"):
        register("bico", human_name="x", description="x", reference="x", needs="x", options=Opts)(object)
    assert [i.name for i in list_methods()] == names  # the failed registration changed nothing


def _doc_example(name: str) -> str:
    text = (ROOT / "docs" / "transfer.md").read_text(encoding="utf-8")
    m = re.search(rf"<!-- example: {name} -->\n```python\n(.*?)```", text, re.S)
    assert m, f"docs/transfer.md has no example {name!r}"
    return m.group(1)


def test_the_documented_user_method_runs_end_to_end():
    A = mlp(0)
    env = {"model_a": A, "model_a_ft": shifted(A, 1), "model_b": mlp(2)}
    from ftlab.transfer.methods import registry

    before = dict(registry._REGISTRY)
    try:
        exec(compile(_doc_example("user-method"), "docs/transfer.md", "exec"), env)
        tau_a = TaskVector.from_models(A, env["model_a_ft"])
        for k, v in env["tau_b"].items():
            torch.testing.assert_close(v, 0.25 * tau_a[k])
        with pytest.raises(ValueError, match="factor=2"):
            get_method("shrink", factor=2)
        with pytest.raises(ValueError, match="shrink needs equal shapes"):
            transfer(A, env["model_a_ft"], mlp(2, h=9), method="shrink")
    finally:
        registry._REGISTRY.clear()
        registry._REGISTRY.update(before)


# -- one options object ----------------------------------------------------------------------------------


RICH = dict(depth_map="prefix", seq_align="mean", n_prefix=1, padding_mask="mask", seq_first=True,
            zero_params=("*bias",), source_overrides={"0.bias": [Rule("0.bias", "zero")]},
            target_overrides={"2.weight": [Rule("2.weight", "weight", "2", (0, 1))]}, diagnostics=True,
            batch_dtype="float32", cka_batches=2, source_stats="finetuned", train_mode=True, loss_reduction="sum",
            stages={"blocks": ((0, 1), (0, 0, 1))}, name_map={"attn.q": "attention.query"},
            vocab_map=[-1, -1, 0, 1, 2, 3, 7, 7, 7], norm_gain="diagonal", memory_limit=2e9)


def test_a_record_rebuilds_its_options_exactly():
    for kw in ({}, RICH, {**RICH, "vocab_map": {"emb.weight": list(range(-1, 30))}}):
        opts = TransferOptions(**kw)
        rec = json.loads(json.dumps(opts.record()))
        back = TransferOptions.from_record(rec)
        assert back == opts and back.record() == rec
        assert set(rec) == set(TransferOptions.field_names())
    assert TransferOptions.from_record(TransferOptions(**RICH).record(), depth_map="cka").depth_map == "cka"
    assert TransferOptions(**RICH) != TransferOptions(**{**RICH, "memory_limit": 3e9})


def test_a_recorded_callable_must_be_given_again():
    def mask(batch):
        return None

    rec = TransferOptions(padding_mask=mask).record()
    assert rec["padding_mask"] == {"callable": f"{__name__}.{mask.__qualname__}"}
    with pytest.raises(ValueError, match="'padding_mask' was the Python callable"):
        TransferOptions.from_record(rec)
    assert TransferOptions.from_record(rec, padding_mask=mask).padding_mask is mask
    with pytest.raises(ValueError, match="unknown transfer option 'depth_scale'"):
        TransferOptions.from_record({**rec, "depth_scale": 2.0}, padding_mask=mask)


def test_every_option_has_help_and_one_command_line_flag():
    from click.testing import CliRunner

    from ftlab.cli.main import cli

    text = " ".join(CliRunner().invoke(cli, ["transfer", "--help"], terminal_width=200).output.split())
    for f in cli_fields():
        assert f.metadata["help"], f"{f.name} has no help"
        assert "--" + f.name.replace("_", "-") in text, f"ftlab transfer has no flag for {f.name}"
    # the defaults shown are the library's own (one default per concept)
    assert f"[default: {TransferOptions().depth_map}]" in text


def test_command_line_values_parse_into_the_same_options_as_python():
    from ftlab.cli.transfer import build_options

    given = {"depth_map": "prefix", "zero_params": "*bias, *pos_embed*", "stages": '{"blocks": [[0, 1], [0, 0, 1]]}',
             "vocab_map": '{"runs": [[-1, 0, 2], [0, 1, 4], [7, 0, 3]]}', "memory_limit": "2e9", "seq_first": True,
             "padding_mask": "none", "target_overrides": '{"2.weight": [{"param": "2.weight", "kind": "weight", '
                                                           '"point": "2"}]}'}
    opts = build_options(given, None)
    assert opts == TransferOptions(depth_map="prefix", zero_params=("*bias", "*pos_embed*"),
                                   stages={"blocks": ((0, 1), (0, 0, 1))}, vocab_map=[-1, -1, 0, 1, 2, 3, 7, 7, 7],
                                   memory_limit=2e9, seq_first=True, padding_mask=None,
                                   target_overrides={"2.weight": [Rule("2.weight", "weight", "2")]})
    with pytest.raises(ValueError, match="--stages='{bad' is invalid"):
        build_options({"stages": "{bad"}, None)


# -- module modes -----------------------------------------------------------------------------------------


class FrozenBN(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(self.bn(self.conv(x)).mean((2, 3)))


def test_every_module_gets_its_own_mode_back_a_deliberately_frozen_batchnorm_stays_in_eval():
    from ftlab.core.hooks import activations
    from ftlab.core.modes import module_mode
    from ftlab.experiments.training import accuracy

    model = FrozenBN().double().train()
    model.bn.eval()  # frozen on purpose while the rest trains
    x, y = torch.randn(8, 3, 5, 5, dtype=DT), torch.randint(0, 3, (8,))

    def modes():
        return {n: m.training for n, m in model.named_modules()}

    want = modes()
    assert want[""] and not want["bn"]
    activations(model, x, ["conv"])
    assert modes() == want
    accuracy(model, x, y)
    assert modes() == want
    other = FrozenBN().double()
    fit_transfer(model, shifted(model, 1), other, [(x, y)], ce)
    assert modes() == want
    with pytest.raises(RuntimeError, match="boom"), module_mode(model, train=False):
        assert not any(m.training for m in model.modules())
        raise RuntimeError("boom")
    assert modes() == want


# -- options that change a fit, each against a property ----------------------------------------------------


def test_cka_batches_is_the_number_of_batches_the_cka_depth_map_reads():
    A = nn.Sequential(*[nn.Linear(4, 4) for _ in range(3)]).double()
    calls = []
    A[0].register_forward_hook(lambda mod, *a: calls.append(mod))
    for k in (1, 3):
        calls.clear()
        res = fit_transfer(A, shifted(A, 1), copy.deepcopy(A), data(n=5), lambda m, b: m(b[0]).pow(2).mean(),
                           options=TransferOptions(depth_map="cka", cka_batches=k, capture_budget=0))
        assert res.layer_map[""] == [0, 1, 2]  # a copy maps each block to itself
        assert sum(c is A[0] for c in calls) == k + 5  # the probe read k batches, then the calibration pass all 5 (whole)


def test_train_mode_changes_only_models_whose_train_mode_differs():
    x = data(n=2, rows=8, d=3 * 25)
    batches = [(b[0].reshape(8, 3, 5, 5), b[1]) for b in x]
    A, B = FrozenBN().double().eval(), FrozenBN().double().eval()
    with torch.no_grad():
        for p in B.parameters():
            p.add_(0.3 * torch.randn_like(p))
    A_ft = shifted(A, 2)
    eval_tv = transfer(A, A_ft, B, batches, ce)
    train_tv = transfer(A, A_ft, B, batches, ce, train_mode=True)  # BatchNorm on batch statistics
    assert (eval_tv - train_tv).norm() > 1e-6 * eval_tv.norm()
    assert not A.training and not B.training  # restored
    M, M_ft, N = mlp(0), shifted(mlp(0), 1), mlp(4)  # no BatchNorm, no dropout: train mode is the same function
    b = data()
    torch.testing.assert_close((transfer(M, M_ft, N, b, ce) - transfer(M, M_ft, N, b, ce, train_mode=True)).norm(),
                               0.0, atol=1e-12, rtol=0)


def test_norm_gain_rules_agree_on_a_permuted_copy_and_diagonal_is_the_squared_map_rule():
    torch.manual_seed(0)
    A = nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.Linear(6, 3)).double()
    perm = torch.randperm(6)
    B = copy.deepcopy(A)
    with torch.no_grad():
        B[0].weight.copy_(A[0].weight[perm])
        B[0].bias.copy_(A[0].bias[perm])
        B[1].weight.copy_(A[1].weight[perm])
        B[1].bias.copy_(A[1].bias[perm])
        B[2].weight.copy_(A[2].weight[:, perm])
    A_ft = shifted(A, 3)
    truth = TaskVector.from_models(A, A_ft)["1.weight"][perm]
    b = data(n=4)
    for rule in ("vector", "diagonal"):
        torch.testing.assert_close(transfer(A, A_ft, B, b, ce, norm_gain=rule)["1.weight"], truth)
    C = mlp(5, h=6)
    C = nn.Sequential(C[0], nn.LayerNorm(6), C[2]).double()  # unrelated target: the rules differ
    res = fit_transfer(A, A_ft, C, b, ce, options=TransferOptions(norm_gain="diagonal"))
    R = res.fits["1"][1].R
    tau = TaskVector.from_models(A, A_ft)["1.weight"]
    torch.testing.assert_close(res.task_vector["1.weight"], (R * R).T @ tau)
    vec = transfer(A, A_ft, C, b, ce)["1.weight"]
    torch.testing.assert_close(vec, R.T @ tau)
    assert (vec - res.task_vector["1.weight"]).norm() > 1e-3


class Attn(nn.Module):
    def __init__(self, batch_first, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Linear(3, 8)
        self.mha = nn.MultiheadAttention(8, 2, batch_first=batch_first)
        self.ff = nn.Linear(8, 8)
        self.out = nn.Linear(8, 2)
        self.batch_first = batch_first

    def forward(self, x):  # x: (B, T, 3) always; the attention's own layout inside
        h = self.emb(x if self.batch_first else x.transpose(0, 1))
        h = h + self.mha(h, h, h, need_weights=False)[0]
        h = self.ff(torch.tanh(h))
        return self.out(h.mean(1 if self.batch_first else 0))


def test_seq_first_makes_a_sequence_first_model_transfer_like_its_batch_first_twin():
    g = torch.Generator().manual_seed(0)
    b = [(torch.randn(4, 5, 3, generator=g, dtype=DT), torch.randint(0, 2, (4,), generator=g)) for _ in range(3)]
    twins = []
    for first in (True, False):
        A, B = Attn(first, 0).double(), Attn(first, 1).double()
        twins.append(transfer(A, shifted(A, 2), B, b, ce, seq_align="interpolate", seq_first=not first))
    for k in twins[0]:
        torch.testing.assert_close(twins[0][k], twins[1][k], rtol=1e-9, atol=1e-12)


def test_a_whitening_floor_of_one_makes_whitening_a_scalar_and_changes_nothing():
    A, B = mlp(0), mlp(7, h=9)
    A_ft, b = shifted(A, 1), data(n=4)
    plain = transfer(A, A_ft, B, b, ce)
    floored = transfer(A, A_ft, B, b, ce, whiten_p=0.5, eps=1.0)  # every eigenvalue clamped to the largest
    for k in plain:
        torch.testing.assert_close(floored[k], plain[k], rtol=1e-9, atol=1e-12)
    assert (transfer(A, A_ft, B, b, ce, whiten_p=0.5) - plain).norm() > 1e-6
