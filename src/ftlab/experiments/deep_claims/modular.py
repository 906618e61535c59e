"""A Transformer on modular arithmetic: pretrain on (a + b) mod N, fine-tune on (a + b) mod p.

Protocol (ftlab's proposal, spec theory.md Section 7.4, unconfirmed against the paper; every
choice is an option of :class:`ModularProtocol`):

1. **Pretrain** a one-layer :class:`~ftlab.models.transformer.ModularTransformer` (no
   LayerNorm) on ``(a + b) mod N`` for ``a, b`` in ``0..N-1`` (N = 30 = 2 * 3 * 5), on a random
   ``pt_frac`` of the N^2 pairs, full-batch AdamW with weight decay (as in grokking studies).
2. **Fine-tune** on ``(a + b) mod p`` for the same inputs: *reuse* tasks take p dividing N (the
   answer is a function of the pretrained answer ``(a + b) mod N``), *new-prime* tasks take primes
   not dividing N (the answer needs features PT never needed). The readout is re-initialized with
   ``p`` outputs (normal, gamma = 1), then the **balancedness** ``(||W_E||^2 - ||W_U||^2) /
   (||W_E||^2 + ||W_U||^2)`` of the token embedding vs the readout is set to the swept value by
   :func:`~ftlab.deep.interventions.set_balancedness_` (product-preserving; ``when="ft_start"``), or
   the same is done to the freshly initialized network before pretraining (``when="init"``).
   Training uses a random ``ft_frac`` of the pairs; test accuracy on all other pairs.

Lower (negative) balancedness puts the scale in the readout: the "upstream" initialization that
Kunin et al. (2024) found to speed up feature learning and grokking; the paper (Anguita et al.
2026) reports that lower balancedness helps, most on tasks with new prime factors.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from ftlab.core.validate import check_choice, check_int, check_range
from ftlab.deep.interventions import reinit_readout_, set_balancedness_
from ftlab.experiments.training import TrainConfig, accuracy, train_
from ftlab.models.transformer import modular_transformer

__all__ = ["ModularProtocol", "ModularGrid", "QUICK", "FULL", "modular_data", "pretrain_point", "finetune_point",
           "run_modular"]


@dataclass(frozen=True)
class ModularProtocol:
    """Settings of the modular-arithmetic experiment (ftlab's choices, [U] in docs/deep.md)."""

    modulus: int = 30
    pt_frac: float = 0.8
    d_model: int = 64
    n_heads: int = 4
    d_mlp: int = 128
    lr: float = 3e-3
    weight_decay: float = 1.0
    pt_steps: int = 500
    ft_steps: int = 200
    when: Literal["ft_start", "init"] = "ft_start"
    preserve: Literal["product", "total"] = "product"
    gamma: float = 1.0

    def __post_init__(self):
        check_int("modulus", self.modulus, minimum=4)
        check_range("pt_frac", self.pt_frac, 0.0, 1.0, lo_open=True, hi_open=True)
        check_int("pt_steps", self.pt_steps, minimum=1)
        check_int("ft_steps", self.ft_steps, minimum=1)
        check_choice("when", self.when, ("ft_start", "init"))
        check_choice("preserve", self.preserve, ("product", "total"))


@dataclass(frozen=True)
class ModularGrid:
    """Swept values: seeds, fine-tuning moduli (reuse / new primes), fractions, balancedness."""

    seeds: tuple[int, ...] = (0, 1, 2)
    reuse: tuple[int, ...] = (3, 5)
    new: tuple[int, ...] = (7, 11)
    ft_frac: tuple[float, ...] = (0.3,)
    balancedness: tuple[float, ...] = (-0.8, 0.0, 0.8)


QUICK = (ModularProtocol(), ModularGrid())
FULL = (ModularProtocol(pt_steps=1500, ft_steps=600),
        ModularGrid(seeds=tuple(range(6)), reuse=(3, 5, 6, 10), new=(7, 11, 13), ft_frac=(0.2, 0.4),
                    balancedness=(-0.9, -0.5, 0.0, 0.5, 0.9)))


def modular_data(modulus: int, p: int) -> tuple[torch.Tensor, torch.Tensor]:
    """All ``modulus^2`` inputs ``[a, b, =]`` (int64 ``(N^2, 3)``) and labels ``(a + b) mod p``."""
    a, b = torch.meshgrid(torch.arange(modulus), torch.arange(modulus), indexing="ij")
    a, b = a.reshape(-1), b.reshape(-1)
    return torch.stack([a, b, torch.full_like(a, modulus)], 1), (a + b) % p


def _split(n: int, frac: float, seed) -> tuple[np.ndarray, np.ndarray]:
    perm = np.random.default_rng(seed).permutation(n)
    k = int(round(frac * n))
    return perm[:k], perm[k:]


def _ckpt(cache: str, seed: int, b_init) -> Path:
    return Path(cache) / f"modular_pt_seed{seed}_b{'none' if b_init is None else f'{b_init:g}'}.safetensors"


def _model(proto: ModularProtocol, n_classes: int, seed=None):
    return modular_transformer(n_tokens=proto.modulus, n_classes=n_classes, d_model=proto.d_model,
                               n_heads=proto.n_heads, d_mlp=proto.d_mlp, seed=seed)


def pretrain_point(*, seed: int, b_init, protocol: dict, cache: str) -> dict:
    """Pretrain on (a + b) mod N (balancedness set at init when ``b_init`` is not None); save it."""
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    proto = ModularProtocol(**protocol)
    X, y = modular_data(proto.modulus, proto.modulus)
    tr, te = _split(len(y), proto.pt_frac, [seed, 11])
    model = _model(proto, proto.modulus, seed=seed)
    if b_init is not None:
        set_balancedness_(model, b_init, preserve=proto.preserve)
    cfg = TrainConfig(optimizer="adamw", lr=proto.lr, max_steps=proto.pt_steps, batch_size=None,
                      weight_decay=proto.weight_decay, drop_last=True, order="torch")
    res = train_(model, X[tr], y[tr], config=cfg, seed=seed)
    path = _ckpt(cache, seed, b_init)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp))
    tmp.replace(path)
    return {"pt_acc": accuracy(model, X[te], y[te]), "pt_loss": res.residual}


def finetune_point(*, seed: int, p: int, kind: str, ft_frac: float, balancedness: float, protocol: dict,
                   cache: str) -> dict:
    """Fine-tune the pretrained Transformer on (a + b) mod p at a given balancedness."""
    from safetensors.torch import load_file

    torch.set_num_threads(1)
    proto = ModularProtocol(**protocol)
    model = _model(proto, proto.modulus)
    b_init = balancedness if proto.when == "init" else None
    model.load_state_dict(load_file(str(_ckpt(cache, seed, b_init))))
    reinit_readout_(model, gamma=proto.gamma, out_features=p, seed=seed * 1009 + p)
    rec = set_balancedness_(model, balancedness, preserve=proto.preserve) if proto.when == "ft_start" else None
    X, y = modular_data(proto.modulus, p)
    tr, te = _split(len(y), ft_frac, [seed, p, 13])
    cfg = TrainConfig(optimizer="adamw", lr=proto.lr, max_steps=proto.ft_steps, batch_size=None,
                      weight_decay=proto.weight_decay, drop_last=True, order="torch")
    res = train_(model, X[tr], y[tr], config=cfg, seed=seed)
    return {"acc": accuracy(model, X[te], y[te]), "train_loss": res.residual,
            "b_before": rec.before if rec is not None else float("nan")}


def run_modular(proto: ModularProtocol, grid: ModularGrid, out_dir, *, workers=None, scheduler=None):
    """Both stages (resumable, under ``out_dir``); returns ``(pt DataFrame, ft DataFrame)``."""
    from ftlab.core.sweep import run_sweep

    for p in (*grid.reuse, *grid.new):
        check_int("p", p, minimum=2)
    bad = [p for p in grid.reuse if proto.modulus % p]
    if bad:
        raise ValueError(f"reuse modulus p={bad[0]} does not divide N={proto.modulus}")
    bad = [p for p in grid.new if proto.modulus % p == 0]
    if bad:
        raise ValueError(f"new-prime modulus p={bad[0]} divides N={proto.modulus}: it is a reuse task")
    out = Path(out_dir)
    cache = str(out / "checkpoints")
    pdict = dataclasses.asdict(proto)
    b_inits = list(grid.balancedness) if proto.when == "init" else [None]
    pt_points = [dict(seed=s, b_init=b, protocol=pdict, cache=cache) for s in grid.seeds for b in b_inits]
    pt = run_sweep(pretrain_point, pt_points, store=out / "modular_pt.jsonl", workers=workers, scheduler=scheduler,
                   desc="deep: modular pretrain")
    tasks = [(p, "reuse") for p in grid.reuse] + [(p, "new") for p in grid.new]
    points = [dict(seed=s, p=p, kind=k, ft_frac=f, balancedness=float(b), protocol=pdict, cache=cache)
              for s in grid.seeds for p, k in tasks for f in grid.ft_frac for b in grid.balancedness]
    ft = run_sweep(finetune_point, points, store=out / "modular_ft.jsonl", workers=workers, scheduler=scheduler,
                   desc="deep: modular fine-tune")
    return pt.drop(columns=["protocol", "cache"]), ft.drop(columns=["protocol", "cache"])
