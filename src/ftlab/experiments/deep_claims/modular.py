"""A Transformer on modular arithmetic: pretrain on (a + b) mod N, fine-tune on (a + b) mod p over balancedness.

Protocol (ftlab's; the paper's Transformer protocol is not available, so every setting is an option
of :class:`ModularProtocol` / :class:`ModularGrid`, documented in docs/deep.md):

1. **Pretrain** a one-layer LayerNorm-free :class:`~ftlab.models.transformer.ModularTransformer` on
   ``(a + b) mod N`` (N = 30 = 2 * 3 * 5) for a random ``pt_frac`` of the N^2 pairs ``a, b`` in
   ``0..N-1``; full-batch Adam **without weight decay** (weight decay would shrink the weights
   towards a fixed balance and break the conserved quantity that balancedness is about), until the
   training loss is below ``loss_target`` or ``pt_steps`` steps.
2. **Balancedness** ``b = (||W_in||^2 - ||W_U||^2) / (||W_in||^2 + ||W_U||^2)`` (token and positional
   embeddings vs readout, :func:`ftlab.deep.balancedness`) is set by
   :func:`ftlab.deep.set_balancedness_`, a function-preserving rescale of the residual stream
   (positional embeddings scale with the token embedding), either on the freshly initialized
   network before pretraining (``when="init"``) or at the start of fine-tuning (``when="post"``,
   on the network pretrained without any rescale, *after* its readout was re-initialized, so the
   network that starts fine-tuning has balancedness exactly ``b``: measured as ``b_ft_start`` and
   asserted, a ``RuntimeError`` otherwise).
3. **Fine-tune** all parameters on ``(a + b) mod p`` for a random ``ft_frac`` of the pairs, after
   re-initializing the readout with ``p`` outputs at a scale ``gamma`` that is the same for every
   balancedness arm (same draw); *reuse* tasks take ``p`` dividing N (their answer is a function
   of the pretrained answer), *new* tasks take ``p`` with a prime factor not dividing N. Test
   accuracy on all other pairs.
4. Learning rates: one rate per stage for every arm, chosen from ``lrs`` on the reference arm (no
   rescale for pretraining, ``b = 0`` at the start of fine-tuning) on a tuning seed: the rate
   reaching the loss target in the fewest steps, else the lowest final loss; ``lr_per_arm=True``
   tunes every arm separately (a sensitivity analysis). An evaluation run that diverges is redone
   from the same start at the next lower rate of ``lrs`` (``pt_lr_used`` / ``ft_lr_used`` and
   ``*_retries`` record it).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from ftlab.core.validate import check_choice, check_int, check_positive, check_range
from ftlab.deep import balancedness, reinit_readout_, set_balancedness_
from ftlab.experiments.training import TrainConfig, accuracy, train_
from ftlab.models.transformer import modular_transformer

__all__ = ["FULL", "QUICK", "ModularGrid", "ModularProtocol", "finetune_point", "modular_data", "pretrain_point",
           "run_modular"]


@dataclass(frozen=True)
class ModularProtocol:
    """Settings of the modular-arithmetic experiment (ftlab's choices; docs/deep.md)."""

    modulus: int = 30
    pt_frac: float = 0.8
    ft_frac: float = 0.3
    d_model: int = 64
    n_heads: int = 4
    d_mlp: int = 128
    lrs: tuple[float, ...] = (1e-3, 3e-3, 1e-2)
    pt_steps: int = 1000
    ft_steps: int = 600
    loss_target: float = 0.01
    gamma: float = 1.0
    tune_seed: int = 1000
    tune_p: int = 7
    lr_per_arm: bool = False

    def __post_init__(self):
        check_int("modulus", self.modulus, minimum=4)
        check_range("pt_frac", self.pt_frac, 0.0, 1.0, lo_open=True, hi_open=True)
        check_range("ft_frac", self.ft_frac, 0.0, 1.0, lo_open=True, hi_open=True)
        check_int("pt_steps", self.pt_steps, minimum=1)
        check_int("ft_steps", self.ft_steps, minimum=1)
        for lr in self.lrs:
            check_positive("learning rate", lr)
        if not self.lrs:
            raise ValueError("lrs is empty: give at least one learning rate")
        check_positive("gamma", self.gamma)
        check_int("tune_p", self.tune_p, minimum=2)


@dataclass(frozen=True)
class ModularGrid:
    """Swept values: seeds, fine-tuning moduli (reuse / new prime factors), balancedness values."""

    seeds: tuple[int, ...] = (0, 1)
    reuse: tuple[int, ...] = (3, 5, 10)
    new: tuple[int, ...] = (7, 11, 14)
    balancedness: tuple[float, ...] = (-0.9, -0.5, 0.0, 0.5, 0.9)
    whens: tuple[str, ...] = ("init", "post")

    def __post_init__(self):
        for b in self.balancedness:
            check_range("balancedness", b, -1.0, 1.0, lo_open=True, hi_open=True)
        if 0.0 not in self.balancedness:
            raise ValueError(f"balancedness={self.balancedness} must include 0 (the reference arm)")
        for w in self.whens:
            check_choice("when", w, ("init", "post"))
        for p in (*self.reuse, *self.new):
            check_int("p", p, minimum=2)
        if not self.seeds:
            raise ValueError("seeds is empty: give at least one seed")


QUICK = (ModularProtocol(lrs=(3e-3,), pt_steps=400, ft_steps=300),
         ModularGrid(seeds=(0, 1), reuse=(5,), new=(7,), balancedness=(-0.9, 0.0, 0.9)))
FULL = (ModularProtocol(), ModularGrid(seeds=tuple(range(58))))  # 80% power for 2 points (docs/deep-pilot.csv)


def _prime_factors(n: int) -> set[int]:
    out, d = set(), 2
    while d * d <= n:
        while n % d == 0:
            out.add(d)
            n //= d
        d += 1
    if n > 1:
        out.add(n)
    return out


def task_kind(modulus: int, p: int) -> str:
    """``"reuse"`` if every prime factor of ``p`` divides ``modulus``, else ``"new"``."""
    return "reuse" if _prime_factors(p) <= _prime_factors(modulus) else "new"


def modular_data(modulus: int, p: int) -> tuple[torch.Tensor, torch.Tensor]:
    """All ``modulus^2`` inputs ``[a, b, =]`` (int64 ``(N^2, 3)``) and labels ``(a + b) mod p``."""
    a, b = torch.meshgrid(torch.arange(modulus), torch.arange(modulus), indexing="ij")
    a, b = a.reshape(-1), b.reshape(-1)
    return torch.stack([a, b, torch.full_like(a, modulus)], 1), (a + b) % p


def _split(n: int, frac: float, seed) -> tuple[np.ndarray, np.ndarray]:
    perm = np.random.default_rng(seed).permutation(n)
    k = int(round(frac * n))
    return perm[:k], perm[k:]


def _ckpt(cache: str, seed: int, b_init: float | None) -> Path:
    return Path(cache) / f"modular_pt_seed{seed}_b{'none' if b_init is None else f'{b_init:g}'}.safetensors"


def _model(proto: ModularProtocol, n_classes: int, seed=None):
    return modular_transformer(n_tokens=proto.modulus, n_classes=n_classes, d_model=proto.d_model,
                               n_heads=proto.n_heads, d_mlp=proto.d_mlp, seed=seed)


def _cfg(proto: ModularProtocol, lr: float, steps: int) -> TrainConfig:
    return TrainConfig(optimizer="adamw", lr=lr, weight_decay=0.0, batch_size=None, max_steps=steps,
                       loss_tol=proto.loss_target)


def pretrain_point(*, seed: int, b_init: float | None, lr: float, protocol: dict, cache: str, save: bool = True) -> dict:
    """Pretrain on (a + b) mod N (balancedness set at init when ``b_init`` is not None); save it."""
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    t0 = time.process_time()
    proto = ModularProtocol(**protocol)
    X, y = modular_data(proto.modulus, proto.modulus)
    tr, te = _split(len(y), proto.pt_frac, [seed, 11])
    from ftlab.experiments.deep_claims.vision import fallback_rates

    rates = fallback_rates(lr, proto.lrs) if save else [lr]  # a tuning run (save=False) must see divergence
    for retries, rate in enumerate(rates):  # noqa: B007 (read after it): a diverged run is redone at a lower rate
        model = _model(proto, proto.modulus, seed=seed)
        if b_init is not None:
            set_balancedness_(model, b_init)
        res = train_(model, X[tr], y[tr], config=_cfg(proto, rate, proto.pt_steps), seed=seed)
        if math.isfinite(res.residual):
            break
    if save:
        path = _ckpt(cache, seed, b_init)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp))
        tmp.replace(path)
    ok = math.isfinite(res.residual)
    return {"pt_acc": accuracy(model, X[te], y[te]) if ok else math.nan, "pt_loss": res.residual,
            "pt_steps": res.n_iter, "pt_converged": res.converged, "b_after_pt": balancedness(model) if ok else math.nan,
            "pt_lr_used": rate, "pt_retries": retries, "cpu_s": time.process_time() - t0}


def finetune_point(*, seed: int, p: int, when: str, b: float, lr: float, protocol: dict, cache: str) -> dict:
    """Fine-tune on (a + b) mod p from the pretrained network of the arm (see the module docs);
    ``b_ft_start`` is the balancedness of the network that starts fine-tuning."""
    from safetensors.torch import load_file

    torch.set_num_threads(1)
    t0 = time.process_time()
    proto = ModularProtocol(**protocol)
    from ftlab.experiments.deep_claims.vision import fallback_rates

    X, y = modular_data(proto.modulus, p)
    tr, te = _split(len(y), proto.ft_frac, [seed, p, 13])
    # tuning runs (the tuning seed) must see divergence; a diverged evaluation run is redone at the next lower rate
    rates = [lr] if seed == proto.tune_seed else fallback_rates(lr, proto.lrs)
    for retries, rate in enumerate(rates):  # noqa: B007 -- read after the loop
        model = _model(proto, proto.modulus)
        model.load_state_dict(load_file(str(_ckpt(cache, seed, b if when == "init" else None))))
        b_pt = balancedness(model)
        reinit_readout_(model, gamma=proto.gamma, out_features=p, seed=seed * 1009 + p)
        if when == "post":  # after the fresh readout, so that fine-tuning starts at balancedness b
            set_balancedness_(model, b)
        b_start = balancedness(model)
        if when == "post" and abs(b_start - b) > 1e-6:
            raise RuntimeError(f"balancedness {b_start:.6f} at the start of fine-tuning, not the intended b={b}")
        res = train_(model, X[tr], y[tr], config=_cfg(proto, rate, proto.ft_steps), seed=seed)
        if math.isfinite(res.residual):
            break
    ok = math.isfinite(res.residual)
    return {"acc": accuracy(model, X[te], y[te]) if ok else math.nan, "ft_loss": res.residual, "ft_steps": res.n_iter,
            "ft_converged": res.converged, "b_pt_end": b_pt, "b_ft_start": b_start, "ft_lr_used": rate,
            "ft_retries": retries, "cpu_s": time.process_time() - t0}


def run_modular(proto: ModularProtocol, grid: ModularGrid, out_dir, *, workers=None,
                scheduler=None) -> dict[str, pd.DataFrame]:
    """Learning-rate tuning, pretraining and fine-tuning (resumable, under ``out_dir``); returns
    ``{"pt_tune", "pt", "ft_tune", "ft"}`` (``ft`` has a ``kind`` column: reuse / new)."""
    from ftlab.core.sweep import run_sweep
    from ftlab.experiments.deep_claims.vision import pick_lr

    bad = [p for p in grid.reuse if task_kind(proto.modulus, p) != "reuse"]
    if bad:
        raise ValueError(f"reuse modulus p={bad[0]} has a prime factor that does not divide N={proto.modulus}")
    bad = [p for p in grid.new if task_kind(proto.modulus, p) != "new"]
    if bad:
        raise ValueError(f"new-prime modulus p={bad[0]} has only prime factors of N={proto.modulus}: it is a reuse task")
    if proto.tune_seed in grid.seeds:
        raise ValueError(f"tune_seed={proto.tune_seed} is also an evaluation seed: choose another")
    out = Path(out_dir)
    cache = str(out / "checkpoints")
    pdict = dataclasses.asdict(proto)

    def sweep(fn, points, name, desc):
        df = run_sweep(fn, points, store=out / f"{name}.jsonl", workers=workers, scheduler=scheduler, desc=desc)
        return df.drop(columns=[c for c in ("protocol", "cache", "save") if c in df.columns])

    b_inits: list[Any] = ([None] if "post" in grid.whens else []) + (
        [float(b) for b in grid.balancedness] if "init" in grid.whens else [])
    ref_b: float | None = None if "post" in grid.whens else 0.0  # the reference arm: no rescale, or b = 0 at init
    ref_ft = ("post" if "post" in grid.whens else "init", 0.0)
    tune_b = b_inits if proto.lr_per_arm else [ref_b]
    pts = [dict(seed=proto.tune_seed, b_init=b, lr=lr, protocol=pdict, cache=cache, save=False)
           for b in tune_b for lr in proto.lrs]

    def key(b: float | None) -> tuple[str]:
        return ("none" if b is None or b != b else f"{b:g}",)

    if len(proto.lrs) > 1:
        pt_tune = sweep(pretrain_point, pts, "modular_pt_tune", "deep: tune modular PT learning rates")
        pt_tune["b_key"] = [key(b)[0] for b in pt_tune.b_init]
        pt_lr = pick_lr(pt_tune, ["b_key"], loss="pt_loss", steps="pt_steps", converged="pt_converged",
                        chance=math.log(proto.modulus))
        pt_tune = pt_tune.drop(columns=["b_key"])
    else:  # a single rate: nothing to tune
        pt_tune = pd.DataFrame()
        pt_lr = {key(b): proto.lrs[0] for b in tune_b}

    arms = [(w, float(b)) for w in grid.whens for b in grid.balancedness]
    tune_arms = arms if proto.lr_per_arm else [ref_ft]
    need = {None if w == "post" else b for w, b in tune_arms}  # PT networks the tuning seed's FT runs start from
    pts = [dict(seed=s, b_init=b, lr=pt_lr[key(b if proto.lr_per_arm else ref_b)], protocol=pdict, cache=cache)
           for s in (proto.tune_seed, *grid.seeds) for b in b_inits
           if s != proto.tune_seed or (len(proto.lrs) > 1 and b in need)]  # the tuning seed: what its FT tuning needs
    pt = sweep(pretrain_point, pts, "modular_pt", "deep: modular pretrain")
    pts = [dict(seed=proto.tune_seed, p=proto.tune_p, when=w, b=b, lr=lr, protocol=pdict, cache=cache)
           for w, b in tune_arms for lr in proto.lrs]
    if len(proto.lrs) > 1:
        ft_tune = sweep(finetune_point, pts, "modular_ft_tune", "deep: tune modular FT learning rates")
        ft_lr = pick_lr(ft_tune, ["when", "b"], loss="ft_loss", steps="ft_steps", converged="ft_converged",
                        chance=math.log(proto.tune_p))
    else:
        ft_tune = pd.DataFrame()
        ft_lr = {(w, b): proto.lrs[0] for w, b in tune_arms}
    pts = [dict(seed=s, p=p, when=w, b=b, lr=ft_lr[(w, b) if proto.lr_per_arm else ref_ft], protocol=pdict, cache=cache)
           for s in grid.seeds for p in (*grid.reuse, *grid.new) for w, b in arms]
    ft = sweep(finetune_point, pts, "modular_ft", "deep: modular fine-tune")
    ft["kind"] = [task_kind(proto.modulus, int(p)) for p in ft.p]
    return {"pt_tune": pt_tune, "pt": pt, "ft_tune": ft_tune, "ft": ft}
