"""Vision experiments: two architectures pretrained, intervened on one knob at a time, and fine-tuned.

Protocol (ftlab's; the paper's deep-network protocol is not available, so every setting is an
option of :class:`VisionProtocol` / :class:`VisionGrid`, documented in docs/deep.md):

* **Architectures**, side by side: ``resnet18`` (:class:`ftlab.models.resnet.ResNet18`, with
  BatchNorm, the paper's) and ``nf_resnet18`` (:class:`ftlab.models.cnn.NFResNet18`, the same
  topology without normalization and biases, in which a rebalance is exact).
* **Knobs, one at a time** (an *arm* is ``(knob, when, value)``; the baseline is
  ``("none", "-", 1)``): relative scale ``kappa`` at pretraining initialization (``when="init"``,
  the analogue of lambda_PT) and as a function-preserving rebalance of the pretrained network
  (``when="post"``), both by :func:`ftlab.deep.rebalance_` (``normalization="absorb"`` for the
  BatchNorm network, where it only changes effective learning rates); absolute scale ``s`` at
  pretraining initialization (the analogue of c_PT: the initialized network's output is multiplied by
  about ``s``; see :func:`_absolute_`); readout
  scale ``gamma`` of the fresh readout at the start of fine-tuning (``when="ft"``,
  :func:`ftlab.deep.reinit_readout_`, the analogue of gamma_FT), ``gamma_default`` otherwise.
* **Pretraining**: ``n_pt`` class-balanced Fashion-MNIST images of the 8 pretraining classes,
  SGD with momentum, warm-up then cosine decay over ``pt_epochs`` epochs, stopped at the first
  epoch whose mean training loss is below ``loss_target``.
* **Knobs at the start of fine-tuning**: kappa after pretraining is applied *after* the readout is
  re-initialized, so the network that starts fine-tuning is the exact rebalance of the one the
  baseline starts from (same function, weight norm moved between the first layer and the fresh
  readout); every such run measures the factors and the function change and raises if they are not
  the intended ones (``kappa_stem_factor``, ``kappa_readout_factor``, ``kappa_fn_change``).
* **Fine-tuning**: all parameters, on ``n_ft`` class-balanced images of a task (``pt_subset``,
  ``heldout``, ``mnist``; :mod:`.data`), SGD with momentum and a constant learning rate until the
  epoch-mean training loss is below ``loss_target`` or ``ft_max_steps`` steps; BatchNorm running
  statistics are then recomputed on the fine-tuning images (``resnet18``).
* **Learning rates**: one rate per architecture and stage for every arm, chosen on the baseline arm
  (``lr_per_arm=False``, the default: arms then differ only in their knob); ``lr_per_arm=True`` chooses
  one per (architecture, arm) instead, a sensitivity analysis. The rate is chosen from a small grid
  (``pt_lrs``, ``ft_lrs``) on a tuning seed that is not an evaluation seed (:func:`pick_lr`): the
  healthy rate that reaches the loss target
  in the fewest steps, else the lowest final training loss, one grid step lower when the next
  larger rate diverged or collapsed. A pretraining tuning run is the first ``pt_tune_epochs``
  epochs of the real schedule; a fine-tuning one the real recipe at ``ft_tune_n`` images of
  ``ft_tune_task``. Every tuning run is recorded. The rate is tuned on one seed: an evaluation run
  that diverges (or, in pretraining, collapses to chance) is redone from the same start at the next
  lower rate of the grid, and the rate it used is recorded (``pt_lr_used``, ``ft_lr_used``).
* **Pairing**: for a seed, every arm sees the same class split, pretraining images and batch
  order, fine-tuning images, readout draw (up to its scale) and batch order.
* **Measures**: test accuracy on ``n_test`` test images of the task; the reached training loss of
  both stages; at ``n_ft == geometry_at``, per stage, the PR (centred and uncentred) of the
  fine-tuned representation and its ENSD (centred and uncentred, sample space) and linear CKA with
  the *unintervened* pretrained network of the same seed, on ``n_geometry`` task images.

Stages run through :func:`ftlab.core.sweep.run_sweep` (resumable); pretrained networks are cached
as safetensors files.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ftlab.core.validate import check_choice, check_int, check_positive
from ftlab.deep import absolute_scale_, rebalance_, recalibrate_batchnorm_, reinit_readout_
from ftlab.experiments.deep_claims.data import FT_TASKS, N_PT_CLASSES, balanced_subset, pt_pool, task_pool, to_tensor
from ftlab.experiments.training import TrainConfig, TrainResult, accuracy, train_

__all__ = ["ARCHS", "FULL", "QUICK", "Arm", "VisionGrid", "VisionProtocol", "arms", "elr_table", "finetune_point",
           "fallback_rates", "healthy", "pick_lr", "pretrain_point", "run_vision"]

ARCHS = ("resnet18", "nf_resnet18")
Arm = tuple[str, str, float]  # (knob, when, value)
BASELINE: Arm = ("none", "-", 1.0)


@dataclass(frozen=True)
class VisionProtocol:
    """Every fixed setting of the vision experiments (ftlab's choices; docs/deep.md)."""

    archs: tuple[str, ...] = ARCHS
    width: int = 8
    downsample: int = 2
    n_pt: int = 1200
    pt_epochs: int = 100
    pt_batch: int = 128
    pt_lrs: tuple[float, ...] = (0.01, 0.02, 0.05)
    pt_tune_epochs: int = 12
    ft_batch: int = 64
    ft_max_steps: int = 300
    ft_lrs: tuple[float, ...] = (0.003, 0.01, 0.03, 0.1)
    ft_tune_task: str = "mnist"
    ft_tune_n: int = 100
    momentum: float = 0.9
    loss_target: float = 0.01
    gamma_default: float = 1.0
    n_test: int = 1000
    n_geometry: int = 256
    geometry_at: int = 100
    stages: tuple[str, ...] = ("stem", "layer1", "layer2", "layer3", "layer4", "pool")
    tune_seed: int = 1000
    bn_recalibrate: bool = True
    lr_per_arm: bool = False

    def __post_init__(self):
        for a in self.archs:
            check_choice("arch", a, ARCHS)
        check_int("width", self.width, minimum=1)
        check_int("downsample", self.downsample, minimum=1)
        check_int("n_pt", self.n_pt, minimum=8)
        check_int("pt_epochs", self.pt_epochs, minimum=1)
        check_int("pt_tune_epochs", self.pt_tune_epochs, minimum=1)
        check_int("ft_max_steps", self.ft_max_steps, minimum=1)
        check_choice("ft_tune_task", self.ft_tune_task, FT_TASKS)
        for lr in (*self.pt_lrs, *self.ft_lrs):
            check_positive("learning rate", lr)
        if not self.pt_lrs or not self.ft_lrs:
            raise ValueError("pt_lrs and ft_lrs must each hold at least one learning rate")
        check_positive("loss_target", self.loss_target)
        check_positive("gamma_default", self.gamma_default)


@dataclass(frozen=True)
class VisionGrid:
    """The swept values: seeds, tasks, n_FT, and the knob values (the baseline is always included).

    ``knob_n_ft``: the n_FT values at which the kappa and s arms are fine-tuned (``None`` = all of
    ``n_ft``); the gamma arms and the baseline always use every ``n_ft``."""

    seeds: tuple[int, ...] = (0, 1)
    tasks: tuple[str, ...] = FT_TASKS
    n_ft: tuple[int, ...] = (10, 30, 100, 300)
    kappa: tuple[float, ...] = (0.25, 4.0)
    s: tuple[float, ...] = (0.25, 4.0)
    gamma: tuple[float, ...] = (0.03, 0.1, 0.3, 3.0, 10.0)
    knob_n_ft: tuple[int, ...] | None = None

    def __post_init__(self):
        for t in self.tasks:
            check_choice("task", t, FT_TASKS)
        for v in (*self.kappa, *self.s, *self.gamma):
            check_positive("kappa/s/gamma", v)
        for n in self.n_ft:
            check_int("n_ft", n, minimum=1)
        if self.knob_n_ft is not None and not set(self.knob_n_ft) <= set(self.n_ft):
            raise ValueError(f"knob_n_ft={self.knob_n_ft} must be a subset of n_ft={self.n_ft}")
        if not self.seeds:
            raise ValueError("seeds is empty: give at least one seed")


QUICK = (VisionProtocol(n_pt=500, pt_epochs=30, pt_lrs=(0.05,), ft_lrs=(0.01,), ft_max_steps=150, n_test=500,
                        n_geometry=128, geometry_at=100),
         VisionGrid(seeds=(0, 1), n_ft=(30, 100), kappa=(0.25,), s=(0.25,), gamma=(0.1,)))
FULL = (VisionProtocol(),  # 24 seeds: 15 give 80% power for 2 points (docs/deep-pilot.csv); the rest buys precision
        VisionGrid(seeds=tuple(range(24)), n_ft=(30, 100), gamma=(0.03, 0.1, 0.3, 3.0)))


def arms(grid: VisionGrid, *, gamma_default: float = 1.0) -> list[Arm]:
    """The baseline first, then kappa at init, kappa after PT, s at init, gamma at FT (no duplicates of
    the baseline)."""
    out: list[Arm] = [BASELINE]
    out += [("kappa", "init", float(k)) for k in grid.kappa if k != 1.0]
    out += [("kappa", "post", float(k)) for k in grid.kappa if k != 1.0]
    out += [("s", "init", float(v)) for v in grid.s if v != 1.0]
    out += [("gamma", "ft", float(g)) for g in grid.gamma if g != gamma_default]
    return out


def _pt_arm(arm: Arm) -> Arm:
    return arm if arm[1] == "init" else BASELINE


def _model(arch: str, num_classes: int, width: int, seed: int | None = None) -> torch.nn.Module:
    from ftlab.models.cnn import nf_resnet18
    from ftlab.models.resnet import resnet18

    build = resnet18 if arch == "resnet18" else nf_resnet18
    return build(num_classes=num_classes, width=width, in_channels=1, seed=seed)


def _normalization(arch: str) -> str:
    return "absorb" if arch == "resnet18" else "refuse"


def _absolute_(model: torch.nn.Module, arch: str, s: float) -> None:
    """Absolute scale s: the initialized network's output becomes about ``s`` times larger. (b): exactly,
    by :func:`rebalance_` with ``scale=s`` (factors spread over the layers); (a): every parameter times
    ``sqrt(s)`` (Lippl & Lindsey's weight rescaling; BatchNorm passes ``sqrt(s)`` to the stream and the
    readout adds another, so the logits scale by ``s`` up to the readout bias)."""
    if arch == "resnet18":
        absolute_scale_(model, math.sqrt(s))
    else:
        rebalance_(model, 1.0, scale=s)


def _ckpt(cache: str, arch: str, seed: int, arm: Arm) -> Path:
    knob, when, value = arm
    return Path(cache) / f"pt_{arch}_seed{seed}_{knob}{value:g}.safetensors"


def _fit(model, X, y, *, lr: float, proto: VisionProtocol, seed: int, stage: str, tune: bool = False) -> TrainResult:
    if stage == "pt":  # a tuning run is the first pt_tune_epochs of the real schedule
        n = int(y.shape[0])
        stop = proto.pt_tune_epochs * (n // min(proto.pt_batch, n)) if tune else None
        cfg = TrainConfig(lr=lr, momentum=proto.momentum, batch_size=proto.pt_batch, epochs=proto.pt_epochs,
                          schedule="warmup_cosine", loss_tol=proto.loss_target, drop_last=True, stop_steps=stop)
    else:
        cfg = TrainConfig(lr=lr, momentum=proto.momentum, batch_size=min(proto.ft_batch, int(y.shape[0])),
                          max_steps=proto.ft_max_steps, loss_tol=proto.loss_target)
    return train_(model, X, y, config=cfg, seed=seed)


def pretrain_point(*, arch: str, seed: int, knob: str, value: float, lr: float, protocol: dict, cache: str,
                   tune: bool = False) -> dict:
    """Pretrain one network (initialized, then intervened at init for the kappa/s arms); save it unless
    ``tune`` (a learning-rate tuning run of ``pt_tune_epochs`` epochs). Returns the reached training
    loss, steps, epochs, convergence and the test accuracy on the pretraining classes. A run that is
    not :func:`healthy` (diverged or collapsed) is redone from the same initialization at the next lower
    rate of ``pt_lrs`` (not a tuning run); ``pt_lr_used`` and ``pt_retries`` record it."""
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    t0 = time.process_time()
    proto = VisionProtocol(**protocol)
    x, y, k = pt_pool("train", seed)
    idx = balanced_subset(y, proto.n_pt, seed=[seed, 1])
    X, Y = to_tensor(x[idx], proto.downsample), torch.from_numpy(y[idx])
    rates = [lr] if tune else fallback_rates(lr, proto.pt_lrs)
    for retries, rate in enumerate(rates):  # noqa: B007 (read after it): an unhealthy run is redone lower
        model = _model(arch, k, proto.width, seed=seed)
        if knob == "kappa":
            rebalance_(model, value, normalization=_normalization(arch))  # type: ignore[arg-type]
        elif knob == "s":
            _absolute_(model, arch, value)
        res = _fit(model, X, Y, lr=rate, proto=proto, seed=seed, stage="pt", tune=tune)
        if healthy(res.residual, math.log(k)):
            break
    xt, yt, _ = pt_pool("test", seed)
    ti = np.random.default_rng([seed, 5]).permutation(len(yt))[:proto.n_test]
    acc = accuracy(model, to_tensor(xt[ti], proto.downsample), torch.from_numpy(yt[ti])) if math.isfinite(
        res.residual) else math.nan
    if not tune:
        path = _ckpt(cache, arch, seed, (knob, "init", value))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        save_file({n: t.contiguous() for n, t in model.state_dict().items()}, str(tmp))
        tmp.replace(path)
    return {"pt_loss": res.residual, "pt_steps": res.n_iter, "pt_epochs": res.epochs, "pt_converged": res.converged,
            "pt_acc": acc, "pt_lr_used": rate, "pt_retries": retries, "cpu_s": time.process_time() - t0}


def _load(arch: str, proto: VisionProtocol, cache: str, seed: int, arm: Arm, k_pt: int) -> torch.nn.Module:
    from safetensors.torch import load_file

    model = _model(arch, k_pt, proto.width)
    model.load_state_dict(load_file(str(_ckpt(cache, arch, seed, _pt_arm(arm)))))
    return model


def _rebalance_at_start_(model: torch.nn.Module, arch: str, kappa: float, probe: torch.Tensor) -> dict:
    """kappa after pretraining, applied to the network that starts fine-tuning (its fresh readout
    included), last before training: the result is the exact rebalance of the baseline's starting
    network. Measures the weight factors of the first layer and of the readout and the relative change
    of the outputs on ``probe``; raises ``RuntimeError`` unless the first layer moved in kappa's
    direction by the rebalance's own factor, the readout by its factor, and the function held (1e-3; 2e-2
    in (a), whose BatchNorm keeps it only up to its ``eps``, which weighs more on rescaled statistics)."""
    from ftlab.deep import find_readout

    name = find_readout(model)[0]
    params = dict(model.named_parameters())
    was = model.training
    model.eval()
    with torch.no_grad():
        before = model(probe)
        norms = {n: float(p.double().norm()) for n, p in params.items()}
        rec = rebalance_(model, kappa, normalization=_normalization(arch))  # type: ignore[arg-type]
        after = model(probe)
    model.train(was)
    first = rec.units[0].name + ".weight"
    stem = float(params[first].detach().double().norm()) / norms[first]
    read = float(params[name + ".weight"].detach().double().norm()) / norms[name + ".weight"]
    change = float((after - before).abs().max() / before.abs().max().clamp_min(1e-12))
    tol = 1e-3 if arch != "resnet18" else 2e-2  # (a): BatchNorm's eps weighs more on rescaled statistics
    intended = (math.isclose(stem, rec.units[0].factor, rel_tol=1e-4) and change < tol
                and math.isclose(read, rec.factor(name), rel_tol=1e-4) and (kappa == 1 or (stem - 1) * (kappa - 1) > 0))
    if not intended:
        raise RuntimeError(f"kappa={kappa} after pretraining did not hold at the start of fine-tuning ({arch}): "
                           f"first-layer factor {stem:.4g}, readout factor {read:.4g}, function change {change:.2g}")
    return {"kappa_stem_factor": stem, "kappa_readout_factor": read, "kappa_fn_change": change}


def finetune_point(*, arch: str, seed: int, task: str, n_ft: int, knob: str, when: str, value: float, lr: float,
                   protocol: dict, cache: str, geometry: bool = False) -> dict:
    """One fine-tuning run: load the pretrained network of the arm, re-initialize the readout (gamma),
    rebalance the result (kappa after PT, :func:`_rebalance_at_start_`), fine-tune, evaluate;
    optionally per-stage geometry against the unintervened pretrained network of the same seed. An
    evaluation run (not the tuning seed) whose loss diverges is redone from the same start at the next
    lower rate of ``ft_lrs``; ``ft_lr_used`` and ``ft_retries`` record it."""
    torch.set_num_threads(1)
    t0 = time.process_time()
    proto = VisionProtocol(**protocol)
    arm: Arm = (knob, when, float(value))
    k_pt = N_PT_CLASSES
    x, y, k = task_pool(task, "train", seed)
    tid = FT_TASKS.index(task)
    gamma = float(value) if knob == "gamma" else proto.gamma_default
    idx = balanced_subset(y, n_ft, seed=[seed, tid, n_ft])
    X_ft, y_ft = to_tensor(x[idx], proto.downsample), torch.from_numpy(y[idx])
    # tuning runs (the tuning seed) must see divergence; evaluation runs that diverge are redone from the
    # same start at the next lower rate of the grid (recorded), so no arm loses a seed by diverging
    rates = [lr] if seed == proto.tune_seed else fallback_rates(lr, proto.ft_lrs)
    start: dict = {}
    for retries, rate in enumerate(rates):  # noqa: B007 -- read after the loop
        model = _load(arch, proto, cache, seed, arm, k_pt)
        reinit_readout_(model, gamma=gamma, out_features=k, seed=seed * 100003 + tid * 1009 + n_ft)
        if knob == "kappa" and when == "post":  # last before training, so that it holds at the start of FT
            start = _rebalance_at_start_(model, arch, value, X_ft[:32])
        res = _fit(model, X_ft, y_ft, lr=rate, proto=proto, seed=seed, stage="ft")
        if math.isfinite(res.residual):
            break
    rec: dict = {"ft_loss": res.residual, "ft_steps": res.n_iter, "ft_converged": res.converged, "ft_lr_used": rate,
                 "ft_retries": retries, **start}
    if not math.isfinite(res.residual):
        return {**rec, "acc": math.nan, "cpu_s": time.process_time() - t0}
    if proto.bn_recalibrate and arch == "resnet18":
        recalibrate_batchnorm_(model, X_ft)
    xt, yt, _ = task_pool(task, "test", seed)
    ti = np.random.default_rng([seed, tid, 2]).permutation(len(yt))[:proto.n_test]
    rec["acc"] = accuracy(model, to_tensor(xt[ti], proto.downsample), torch.from_numpy(yt[ti]))
    if geometry and proto.n_geometry > 0:
        from ftlab.core.geometry import layer_geometry
        from ftlab.core.hooks import activations

        gi = balanced_subset(y, min(proto.n_geometry, len(y)), seed=[seed, tid, 3])
        Xg = to_tensor(x[gi], proto.downsample)
        ref = activations(_load(arch, proto, cache, seed, BASELINE, k_pt), Xg, list(proto.stages))
        post = activations(model, Xg, list(proto.stages))
        if all(np.isfinite(np.asarray(v)).all() for v in (*ref.values(), *post.values())):
            for row in layer_geometry(ref, model, Xg, list(proto.stages), space="samples"):
                for key in ("pr_pre", "pr_pre_c", "pr_post", "pr_post_c", "ensd", "ensd_c", "cka"):
                    rec[f"{key}:{row['layer']}"] = row[key]
        else:  # an unhealthy reference or network: no geometry, recorded as such (the claim-4 rows skip it)
            rec["geometry_nonfinite"] = True
    rec["cpu_s"] = time.process_time() - t0
    return rec


def healthy(loss: float, chance: float) -> bool:
    """A training run is healthy when its final loss is finite and below half the ``chance`` loss
    (``log k``): diverged and collapsed (dead-ReLU) runs are not."""
    return bool(math.isfinite(loss) and loss < 0.5 * chance)


def fallback_rates(lr: float, grid: tuple[float, ...]) -> list[float]:
    """``lr`` followed by the smaller rates of ``grid``, largest first: the rates an evaluation run tries
    in turn when a run is unhealthy (the chosen rate was tuned on one seed; another seed may cross the
    edge of stability, and the grid's largest rate has no tested neighbour above it)."""
    check_positive("lr", lr)
    return [float(lr), *sorted((float(r) for r in grid if r < lr), reverse=True)]


def pick_lr(tune: pd.DataFrame, keys: list[str], *, loss: str, steps: str, converged: str,
            chance: float | dict[tuple, float]) -> dict[tuple, float]:
    """The chosen learning rate per group of ``keys`` of a tuning table.

    A run is *healthy* if its final loss is finite and below half the ``chance`` loss (``log k`` of
    a uniform prediction; a scalar or one per group): diverged and collapsed (dead-ReLU) runs are
    not. Among healthy runs: the one that reached the loss target in the fewest steps, else the
    lowest final loss (ties: the smaller rate). If the next larger rate of the grid was not healthy,
    the next smaller healthy rate is taken instead (never a rate at the edge of stability: another
    seed or a longer run may cross it). When no rate is healthy, the smallest is returned (its runs
    then record the failure, never a silent success)."""
    out: dict[tuple, float] = {}
    for key, g in tune.groupby(keys, sort=False):
        k = key if isinstance(key, tuple) else (key,)
        ch = chance[k] if isinstance(chance, dict) else chance
        g = g.sort_values("lr")
        lv = pd.to_numeric(g[loss], errors="coerce").astype(float).to_numpy()
        healthy = np.isfinite(lv) & (lv < 0.5 * ch)
        lrs = g["lr"].astype(float).to_numpy()
        if not healthy.any():
            out[k] = float(lrs.min())
            continue
        ok = g[healthy]
        conv = ok[ok[converged].astype(bool)]
        best = float((conv.sort_values([steps, "lr"]) if len(conv) else ok.sort_values([loss, "lr"])).iloc[0]["lr"])
        i = int(np.flatnonzero(lrs == best)[0])
        if i + 1 < len(lrs) and not healthy[i + 1] and i > 0 and healthy[i - 1]:
            best = float(lrs[i - 1])
        out[k] = best
    return out


def elr_table(proto: VisionProtocol, grid: VisionGrid) -> pd.DataFrame:
    """Per architecture and kappa/s arm, the factor by which each stage's weights were scaled and the
    resulting change of the effective SGD learning rate of its scale-invariant weights (``1/f^2``;
    only weights that feed a BatchNorm are scale-invariant), at initialization (deterministic)."""
    rows = []
    for arch in proto.archs:
        for arm in arms(grid, gamma_default=proto.gamma_default):
            knob, when, value = arm
            if knob not in ("kappa", "s"):
                continue
            model = _model(arch, 8, proto.width, seed=0)
            before = {n: p.detach().double().norm().item() for n, p in model.named_parameters()}
            invariant = set()
            if knob == "kappa":
                rec = rebalance_(model, value, normalization=_normalization(arch))  # type: ignore[arg-type]
                invariant = {u.name + ".weight" for u in rec.units if u.normalized}
            else:
                _absolute_(model, arch, value)
                if arch == "resnet18":
                    invariant = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d)}
                    invariant = {n + ".weight" for n in invariant}
            for stage in (*proto.stages[:-1], "fc"):
                names = [n for n in before if n.startswith(stage + ".") and n.endswith("weight")]
                names = [n for n in names if ".bn" not in n and not n.endswith("shortcut.1.weight")]
                if not names:
                    continue
                params = dict(model.named_parameters())
                f = [params[n].detach().double().norm().item() / before[n] for n in names if before[n] > 0]
                inv = [n for n in names if n in invariant and before[n] > 0]
                elr = [(before[n] / params[n].detach().double().norm().item()) ** 2 for n in inv]
                rows.append({"arch": arch, "knob": knob, "when": when, "value": value, "stage": stage,
                             "weight_factor": float(np.exp(np.mean(np.log(f)))) if f else math.nan,
                             "elr_factor": float(np.exp(np.mean(np.log(elr)))) if elr else math.nan})
    return pd.DataFrame(rows)


def run_vision(proto: VisionProtocol, grid: VisionGrid, out_dir, *, workers=None, scheduler=None) -> dict[str, pd.DataFrame]:
    """All four stages (resumable, under ``out_dir``): pretraining learning-rate tuning, pretraining,
    fine-tuning learning-rate tuning, fine-tuning. Returns ``{"pt_tune", "pt", "ft_tune", "ft"}``."""
    from ftlab.core.sweep import run_sweep

    out = Path(out_dir)
    cache = str(out / "checkpoints")
    pdict = dataclasses.asdict(proto)
    all_arms = arms(grid, gamma_default=proto.gamma_default)
    pt_arms = sorted({_pt_arm(a) for a in all_arms}, key=all_arms.index)
    if proto.tune_seed in grid.seeds:
        raise ValueError(f"tune_seed={proto.tune_seed} is also an evaluation seed: choose another")

    def sweep(fn, points, name, desc):
        df = run_sweep(fn, points, store=out / f"{name}.jsonl", workers=workers, scheduler=scheduler, desc=desc)
        return df.drop(columns=[c for c in ("protocol", "cache") if c in df.columns])

    tune_pt = pt_arms if proto.lr_per_arm else [BASELINE]
    pts = [dict(arch=a, seed=proto.tune_seed, knob=k, value=v, lr=lr, protocol=pdict, cache=cache, tune=True)
           for a in proto.archs for k, _, v in tune_pt for lr in proto.pt_lrs]
    if len(proto.pt_lrs) > 1:
        pt_tune = sweep(pretrain_point, pts, "vision_pt_tune", "deep: tune PT learning rates")
        pt_lr = pick_lr(pt_tune, ["arch", "knob", "value"], loss="pt_loss", steps="pt_steps", converged="pt_converged",
                        chance=math.log(N_PT_CLASSES))
    else:  # a single rate: nothing to tune
        pt_tune = pd.DataFrame()
        pt_lr = {(p["arch"], p["knob"], p["value"]): proto.pt_lrs[0] for p in pts}
    tune_ft = all_arms if proto.lr_per_arm else [BASELINE]
    pts = [dict(arch=a, seed=s, knob=k, value=v, lr=_rate(pt_lr, proto, a, (k, "init", v)), protocol=pdict, cache=cache)
           for a in proto.archs for s in (proto.tune_seed, *grid.seeds) for k, _, v in pt_arms
           if s != proto.tune_seed or (len(proto.ft_lrs) > 1 and (k, v) in {(t[0], t[2]) for t in map(_pt_arm, tune_ft)})]
    _require_checkpoints(out / "vision_pt.jsonl", pts)  # (the tuning seed: only the arms its FT tuning starts from)
    pt = sweep(pretrain_point, pts, "vision_pt", "deep: pretrain")
    pts = [dict(arch=a, seed=proto.tune_seed, task=proto.ft_tune_task, n_ft=proto.ft_tune_n, knob=k, when=w,
                value=v, lr=lr, protocol=pdict, cache=cache) for a in proto.archs for k, w, v in tune_ft
           for lr in proto.ft_lrs]
    if len(proto.ft_lrs) > 1:
        ft_tune = sweep(finetune_point, pts, "vision_ft_tune", "deep: tune FT learning rates")
        ft_lr = pick_lr(ft_tune, ["arch", "knob", "when", "value"], loss="ft_loss", steps="ft_steps",
                        converged="ft_converged", chance=math.log(task_pool(proto.ft_tune_task, "train", 0)[2]))
    else:
        ft_tune = pd.DataFrame()
        ft_lr = {(p["arch"], p["knob"], p["when"], p["value"]): proto.ft_lrs[0] for p in pts}
    pts = []
    for a in proto.archs:
        for s in grid.seeds:
            for t in grid.tasks:
                for k, w, v in all_arms:
                    ns = grid.n_ft if k in ("none", "gamma") or grid.knob_n_ft is None else grid.knob_n_ft
                    for n in ns:
                        pts.append(dict(arch=a, seed=s, task=t, n_ft=n, knob=k, when=w, value=v,
                                        lr=_rate(ft_lr, proto, a, (k, w, v), ft=True), protocol=pdict, cache=cache,
                                        geometry=n == proto.geometry_at))
    ft = sweep(finetune_point, pts, "vision_ft", "deep: fine-tune")
    return {"pt_tune": pt_tune, "pt": pt, "ft_tune": ft_tune, "ft": ft}


def _rate(chosen: dict[tuple, float], proto: VisionProtocol, arch: str, arm: Arm, *, ft: bool = False) -> float:
    """The learning rate of an arm: its own (``lr_per_arm``) or the baseline's of its architecture."""
    knob, when, value = arm if proto.lr_per_arm else BASELINE
    return chosen[(arch, knob, when, value)] if ft else chosen[(arch, knob, value)]


def _require_checkpoints(store: Path, points: list[dict]) -> None:
    """A finished pretraining point whose checkpoint was deleted cannot be resumed silently."""
    from ftlab.core.sweep import point_key, read_store

    done = read_store(store)
    missing = [p for p in points if point_key(pretrain_point, p) in done
               and not _ckpt(p["cache"], p["arch"], p["seed"], (p["knob"], "init", p["value"])).exists()]
    if missing:
        raise ValueError(f"{len(missing)} pretrained checkpoints listed in {store} are missing from "
                         f"{missing[0]['cache']}: delete the store to recompute them")
