"""ResNet-18 pretrain -> intervene -> fine-tune, at CPU scale.

Protocol (ftlab's; the paper's deep-network protocol is unconfirmed, spec theory.md Section 7.4, so
every choice here is a documented option of :class:`ResNetProtocol`, modelled on Lippl & Lindsey
2024's CIFAR-100 protocol, spec Section 7.2):

1. **Pretrain** a CIFAR-style ResNet-18 (width 8 quick / 16 full, 1 input channel) on ``n_pt``
   Fashion-MNIST images of ``n_pt_classes`` (8) randomly chosen classes (permuted per seed),
   SGD with momentum, ``pt_epochs`` epochs.
2. **Intervene** (``when="after_pt"``, default, as Lippl & Lindsey's weight rescaling; or
   ``when="init"``, before pretraining, as the c_PT / lambda_PT of the diagonal theory):
   relative scale kappa (:func:`~ftlab.deep.interventions.relative_scale_`), absolute scale s
   (:func:`~ftlab.deep.interventions.absolute_scale_`), or nothing.
3. **Re-initialize the readout** for the fine-tuning task with scale gamma (``gamma_default`` = 1
   unless gamma is the swept knob; :func:`~ftlab.deep.interventions.reinit_readout_`).
4. **Fine-tune all parameters** on ``n_ft`` class-balanced images of a task: the 2 held-out
   Fashion-MNIST classes (``fmnist_heldout``) or the 10 MNIST digits (``mnist``, the offline
   stand-in for SVHN), SGD until the epoch-mean training loss < 1e-2 or ``ft_max_steps`` steps.
5. **Recalibrate BatchNorm** running statistics on the ``n_ft`` fine-tuning images
   (``bn_recalibrate=True``): a rescale changes activations but not the running statistics
   gathered in pretraining, and a short fine-tuning run does not refresh them; without this step
   rescaled networks collapse to one class in eval mode at small n_FT (a normalization artifact).
6. **Measure** test accuracy on ``n_test`` test images of the task, and (for ``n_ft`` in
   ``geometry_at``) per layer the PR of the representation before/after fine-tuning, their ENSD and
   CKA, on ``n_geometry`` training images of the task.

The two stages are top-level functions (:func:`pretrain_point`, :func:`finetune_point`) run by
:func:`ftlab.core.sweep.run_sweep`; pretrained weights are cached as safetensors files, so both stages
resume. Points are paired: for a given (seed, task, n_ft) every intervention sees the same
pretrained network, fine-tuning images, readout draw (up to its scale) and batch order.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from ftlab.core.geometry import layer_geometry
from ftlab.core.validate import check_choice, check_int, check_positive
from ftlab.deep.interventions import absolute_scale_, recalibrate_batchnorm_, reinit_readout_, relative_scale_
from ftlab.experiments.deep_claims.data import FT_TASKS, balanced_subset, class_split, load_split, task_pool, to_tensor
from ftlab.experiments.training import TrainConfig, accuracy, train_
from ftlab.models.resnet import resnet18

__all__ = ["ResNetProtocol", "ResNetGrid", "QUICK", "FULL", "conditions", "pretrain_point", "finetune_point",
           "run_resnet"]

log = logging.getLogger(__name__)
KNOBS = ("none", "kappa", "s", "gamma")


@dataclass(frozen=True)
class ResNetProtocol:
    """Every setting of the ResNet experiment (all ftlab's choices, marked [U] in docs/deep.md)."""

    width: int = 8
    n_pt_classes: int = 8
    n_pt: int = 4000
    pt_epochs: int = 3
    pt_lr: float = 0.05
    batch_size: int = 128
    momentum: float = 0.9
    ft_lr: float = 0.01
    ft_batch: int = 64
    ft_max_steps: int = 80
    loss_tol: float = 1e-2
    n_test: int = 1000
    n_geometry: int = 256
    geometry_at: tuple[int, ...] = (100,)
    geometry_layers: tuple[str, ...] = ("stem", "layer1", "layer2", "layer3", "layer4", "pool")
    when: Literal["after_pt", "init"] = "after_pt"
    kappa_mode: Literal["both", "early"] = "both"
    kappa_split: float = 0.5
    readout_mode: Literal["normal", "constant"] = "normal"
    gamma_default: float = 1.0
    bn_recalibrate: bool = True

    def __post_init__(self):
        check_int("width", self.width, minimum=1)
        check_int("n_pt", self.n_pt, minimum=self.n_pt_classes)
        check_int("pt_epochs", self.pt_epochs, minimum=1)
        check_int("ft_max_steps", self.ft_max_steps, minimum=1)
        check_positive("pt_lr", self.pt_lr)
        check_positive("ft_lr", self.ft_lr)
        check_choice("when", self.when, ("after_pt", "init"))
        check_choice("kappa_mode", self.kappa_mode, ("both", "early"))
        check_choice("readout_mode", self.readout_mode, ("normal", "constant"))


@dataclass(frozen=True)
class ResNetGrid:
    """The swept values; the baseline (kappa = s = 1, gamma = ``gamma_default``) is always included."""

    seeds: tuple[int, ...] = (0, 1, 2)
    tasks: tuple[str, ...] = FT_TASKS
    n_ft: tuple[int, ...] = (10, 30, 100, 300)
    kappa: tuple[float, ...] = (0.5, 2.0)
    s: tuple[float, ...] = (0.25, 4.0)
    gamma: tuple[float, ...] = (0.1, 10.0)

    def __post_init__(self):
        for t in self.tasks:
            check_choice("task", t, FT_TASKS)
        for v in (*self.kappa, *self.s):
            check_positive("kappa/s", v)
        for g in self.gamma:
            if g < 0:
                raise ValueError(f"gamma={g!r} is out of range: must be >= 0")


QUICK = (ResNetProtocol(), ResNetGrid())
# ``--full`` is sized to run in about an hour on 2 CPU cores (720 fine-tunings): twice the seeds of the
# quick run, n_FT up to 1000, more values of every knob. Wider nets (``--width 16``) or more seeds
# are one flag or ``dataclasses.replace`` away on a bigger machine.
FULL = (
    ResNetProtocol(n_pt=8000, pt_epochs=4, ft_max_steps=150, n_test=2000, geometry_at=(100, 1000)),
    ResNetGrid(seeds=tuple(range(6)), n_ft=(10, 30, 100, 300, 1000), kappa=(0.25, 0.5, 2.0),
               s=(0.25, 0.5, 2.0, 4.0), gamma=(0.0, 0.1, 0.3, 10.0)),
)


def conditions(grid: ResNetGrid) -> list[tuple[str, float]]:
    """``[("none", 1.0), ("kappa", k)..., ("s", s)..., ("gamma", g)...]`` without baseline duplicates."""
    out = [("none", 1.0)]
    out += [("kappa", float(k)) for k in grid.kappa if k != 1.0]
    out += [("s", float(v)) for v in grid.s if v != 1.0]
    out += [("gamma", float(g)) for g in grid.gamma]
    return out


def _pt_key(proto: ResNetProtocol, intervention: str, value: float) -> tuple[str, float]:
    if proto.when == "init" and intervention in ("kappa", "s"):
        return intervention, float(value)
    return "none", 1.0


def _ckpt(cache: str, seed: int, key: tuple[str, float]) -> Path:
    return Path(cache) / f"pt_seed{seed}_{key[0]}{key[1]:g}.safetensors"


def _intervene_(model, proto: ResNetProtocol, intervention: str, value: float) -> None:
    if intervention == "kappa":
        relative_scale_(model, value, mode=proto.kappa_mode, split=proto.kappa_split)
    elif intervention == "s":
        absolute_scale_(model, value)


def pretrain_point(*, seed: int, intervention: str, value: float, protocol: dict, cache: str) -> dict:
    """Pretrain one network (sweep stage 1) and save it to ``cache``; returns PT test accuracy etc."""
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    proto = ResNetProtocol(**protocol)
    pt_classes, _ = class_split(seed, proto.n_pt_classes)
    x, y = load_split("fashion_mnist", "train")
    keep = np.flatnonzero(np.isin(y, pt_classes))
    remap = np.full(10, -1, dtype=np.int64)
    remap[pt_classes] = np.arange(len(pt_classes))
    idx = keep[balanced_subset(y[keep], proto.n_pt, seed=[seed, 1])]
    X, Y = to_tensor(x[idx]), torch.from_numpy(remap[y[idx]])
    model = resnet18(num_classes=len(pt_classes), width=proto.width, in_channels=1, seed=seed)
    if proto.when == "init":
        _intervene_(model, proto, intervention, value)
    steps = proto.pt_epochs * (proto.n_pt // proto.batch_size)
    cfg = TrainConfig(lr=proto.pt_lr, max_steps=steps, batch_size=proto.batch_size, momentum=proto.momentum,
                      drop_last=True, order="torch")
    res = train_(model, X, Y, config=cfg, seed=seed)
    xt, yt = load_split("fashion_mnist", "test")
    tk = np.flatnonzero(np.isin(yt, pt_classes))[:proto.n_test]
    acc = accuracy(model, to_tensor(xt[tk]), torch.from_numpy(remap[yt[tk]]))
    path = _ckpt(cache, seed, (intervention, value))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp))
    tmp.replace(path)
    return {"pt_acc": acc, "pt_loss": res.residual, "pt_steps": res.n_iter}


def finetune_point(*, seed: int, task: str, n_ft: int, intervention: str, value: float, protocol: dict,
                   cache: str) -> dict:
    """One fine-tuning run (sweep stage 2): load the pretrained net, intervene, re-init the readout,
    fine-tune, evaluate; returns accuracy, the training result and per-layer geometry columns."""
    from safetensors.torch import load_file

    torch.set_num_threads(1)
    proto = ResNetProtocol(**protocol)
    check_choice("intervention", intervention, KNOBS)
    model = resnet18(num_classes=proto.n_pt_classes, width=proto.width, in_channels=1)
    model.load_state_dict(load_file(str(_ckpt(cache, seed, _pt_key(proto, intervention, value)))))
    if proto.when == "after_pt":
        _intervene_(model, proto, intervention, value)
    x, y, k = task_pool(task, "train", seed, proto.n_pt_classes)
    gamma = float(value) if intervention == "gamma" else proto.gamma_default
    mode = "zero" if gamma == 0 else proto.readout_mode
    reinit_readout_(model, gamma=gamma, mode=mode, out_features=k, seed=seed * 100003 + n_ft)
    pre = copy.deepcopy(model)
    tid = FT_TASKS.index(task)
    idx = balanced_subset(y, n_ft, seed=[seed, tid, n_ft])
    X_ft = to_tensor(x[idx])
    cfg = TrainConfig(lr=proto.ft_lr, max_steps=proto.ft_max_steps, batch_size=proto.ft_batch, momentum=proto.momentum,
                      loss_tol=proto.loss_tol, drop_last=True, order="torch")
    res = train_(model, X_ft, torch.from_numpy(y[idx]), config=cfg, seed=seed)
    if proto.bn_recalibrate:
        recalibrate_batchnorm_(model, X_ft)
        recalibrate_batchnorm_(pre, X_ft)
    xt, yt, _ = task_pool(task, "test", seed, proto.n_pt_classes)
    ti = np.random.default_rng([seed, tid, 2]).permutation(len(yt))[:proto.n_test]
    rec = {"acc": accuracy(model, to_tensor(xt[ti]), torch.from_numpy(yt[ti])), "converged": res.converged,
           "n_iter": res.n_iter, "train_loss": res.residual}
    if proto.n_geometry > 0 and n_ft in proto.geometry_at:
        gi = balanced_subset(y, min(proto.n_geometry, len(y)), seed=[seed, tid, 3])
        for row in layer_geometry(pre, model, to_tensor(x[gi]), list(proto.geometry_layers)):
            for key in ("pr_pre", "pr_post", "ensd", "cka"):
                rec[f"{key}:{row['layer']}"] = row[key]
    return rec


def run_resnet(proto: ResNetProtocol, grid: ResNetGrid, out_dir, *, workers=None, scheduler=None):
    """Run both stages (resumable; stores and checkpoints under ``out_dir``); returns
    ``(pt DataFrame, ft DataFrame)``."""
    from ftlab.core.sweep import point_key, read_store, run_sweep

    out = Path(out_dir)
    cache = str(out / "checkpoints")
    pdict = dataclasses.asdict(proto)
    conds = conditions(grid)
    pt_keys = sorted({_pt_key(proto, i, v) for i, v in conds})
    pt_points: list[dict] = [dict(seed=s, intervention=i, value=v, protocol=pdict, cache=cache)
                             for s in grid.seeds for i, v in pt_keys]
    store = out / "resnet_pt.jsonl"
    done = read_store(store)
    missing = [p for p in pt_points if point_key(pretrain_point, p) in done
               and not _ckpt(cache, p["seed"], (p["intervention"], p["value"])).exists()]
    if missing:
        raise ValueError(f"{len(missing)} pretrained checkpoints listed in {store} are missing from {cache}: "
                         "delete the store to recompute them")
    pt = run_sweep(pretrain_point, pt_points, store=store, workers=workers, scheduler=scheduler, desc="deep: pretrain")
    ft_points = [dict(seed=s, task=t, n_ft=n, intervention=i, value=v, protocol=pdict, cache=cache)
                 for s in grid.seeds for t in grid.tasks for n in grid.n_ft for i, v in conds]
    ft = run_sweep(finetune_point, ft_points, store=out / "resnet_ft.jsonl", workers=workers, scheduler=scheduler,
                   desc="deep: fine-tune")
    drop = ["protocol", "cache"]
    return pt.drop(columns=drop), ft.drop(columns=drop)
