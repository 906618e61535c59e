"""The family of small ViT base models, pretrained here and cached.

Each base is a :class:`ftlab.models.vit.ViT` pretrained on the joint 20-class label space
(:func:`ftlab.experiments.transfer_accuracy.tasks.pretraining_data`) with AdamW and a cosine schedule.
Pretraining is deterministic given the :class:`BaseSpec` (torch seed, data order), so the cache can
always be rebuilt.

Cache layout (``$FTLAB_CACHE`` or ``~/.cache/ftlab``)::

    transfer-benchmark/<name>-<key>.safetensors   weights (written atomically)
    transfer-benchmark/<name>-<key>.json          sidecar: spec, sha256 of the weights, metrics

``key`` hashes the spec, so a changed recipe never reads an old checkpoint. The sidecar is written
*after* the weights and holds their sha256: a missing sidecar (interrupted pretraining), a missing
or truncated weights file, or a hash mismatch all mean "corrupt", and the base is rebuilt.

**Relatedness targets** (the dose-response axis of the benchmark's second table). A spec with a
``parent`` is not trained from scratch: the parent's weights are trained further for ``epochs``
epochs on pretraining half ``data`` (``epochs = 0``: not at all), then, with ``permute_seed`` set,
every hidden unit is renamed by a random permutation (:func:`permuted_copy`: residual stream, MLP
units, attention heads and the dimensions inside each head), which leaves the function unchanged
but the coordinates arbitrary. So ``vit-perm`` is an exact unit-permuted copy of the source,
``vit-cont1``/``vit-cont4`` are permuted copies trained 1 and 4 epochs more on other images, and
``vit-w64-d4-a-s5`` is an independent model of the same architecture and data.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ftlab.core.results import atomic_write_bytes, save_json
from ftlab.core.validate import check_choice, check_int, check_positive

__all__ = ["BaseSpec", "FAMILY", "SETTINGS", "DOSE_SETTINGS", "cache_dir", "cache_paths", "load_base", "permuted_copy",
           "pretrain", "is_cached"]

log = logging.getLogger(__name__)

_RECIPE_VERSION = 1


@dataclass(frozen=True)
class BaseSpec:
    """How one base model is built and pretrained.

    width, depth, heads, patch : ViT architecture (image 28x28, 1 channel, MLP ratio 2).
    data : pretraining half, ``"a"`` or ``"b"`` (disjoint images).
    seed : torch initialisation and data-order seed.
    n_per_source : pretraining images per source (Fashion-MNIST, MNIST).
    epochs, batch_size, lr, weight_decay : AdamW pretraining with linear warm-up (5% of steps)
        and cosine decay to zero.
    parent : name of a base in :data:`FAMILY` to continue from (then ``epochs`` may be 0 and the
        architecture fields must match the parent's).
    permute_seed : rename the hidden units by the permutation drawn from this seed after training.
    """

    name: str
    width: int = 64
    depth: int = 4
    heads: int = 4
    patch: int = 7
    data: str = "a"
    seed: int = 0
    n_per_source: int = 10_000
    epochs: int = 6
    batch_size: int = 128
    lr: float = 2e-3
    weight_decay: float = 0.05
    parent: str | None = None
    permute_seed: int | None = None

    def __post_init__(self):
        for k in ("width", "depth", "heads", "patch", "n_per_source", "batch_size"):
            check_int(k, getattr(self, k), 1)
        check_int("epochs", self.epochs, 0 if self.parent is not None else 1)
        if self.permute_seed is not None:
            check_int("permute_seed", self.permute_seed, 0)
        check_int("seed", self.seed, 0)
        check_choice("data", self.data, ("a", "b"))
        check_positive("lr", self.lr)

    def vit_config(self):
        from ftlab.experiments.transfer_accuracy.tasks import N_JOINT_CLASSES
        from ftlab.models.vit import ViTConfig

        return ViTConfig(image_size=28, patch=self.patch, channels=1, width=self.width, depth=self.depth,
                         heads=self.heads, mlp_ratio=2, n_classes=N_JOINT_CLASSES)

    def key(self) -> str:
        d = dataclasses.asdict(self)
        if self.parent is None:  # specs without the relatedness fields keep their old keys (and caches)
            d.pop("parent")
            d.pop("permute_seed")
        else:
            d["parent"] = FAMILY[self.parent].key()
        payload = json.dumps({"v": _RECIPE_VERSION, **d}, sort_keys=True)
        return hashlib.sha1(payload.encode()).hexdigest()[:12]


# The source base and one target per setting. Widths 64 (1x) and 96 (1.5x), depths 4 (1x) and 8 (2x);
# the pretraining target has the source's architecture, another seed and disjoint pretraining images.
FAMILY: dict[str, BaseSpec] = {
    s.name: s
    for s in (
        BaseSpec("vit-w64-d4-a-s0", width=64, depth=4, data="a", seed=0),
        BaseSpec("vit-w96-d4-a-s1", width=96, depth=4, data="a", seed=1),
        BaseSpec("vit-w64-d8-a-s2", width=64, depth=8, data="a", seed=2),
        BaseSpec("vit-w64-d4-b-s3", width=64, depth=4, data="b", seed=3),
        BaseSpec("vit-w64-d4-a-s5", width=64, depth=4, data="a", seed=5),
        BaseSpec("vit-perm", width=64, depth=4, data="b", seed=11, parent="vit-w64-d4-a-s0", epochs=0, permute_seed=11),
        BaseSpec("vit-cont1", width=64, depth=4, data="b", seed=12, parent="vit-w64-d4-a-s0", epochs=1, lr=1e-3,
                 permute_seed=12),
        BaseSpec("vit-cont4", width=64, depth=4, data="b", seed=13, parent="vit-w64-d4-a-s0", epochs=4, lr=1e-3,
                 permute_seed=13),
    )
}

# setting -> (source base, target base)
SETTINGS: dict[str, tuple[str, str]] = {
    "width": ("vit-w64-d4-a-s0", "vit-w96-d4-a-s1"),
    "depth": ("vit-w64-d4-a-s0", "vit-w64-d8-a-s2"),
    "pretraining": ("vit-w64-d4-a-s0", "vit-w64-d4-b-s3"),
    "permuted": ("vit-w64-d4-a-s0", "vit-perm"),
    "continued_1ep": ("vit-w64-d4-a-s0", "vit-cont1"),
    "continued_4ep": ("vit-w64-d4-a-s0", "vit-cont4"),
    "independent": ("vit-w64-d4-a-s0", "vit-w64-d4-a-s5"),
}

#: The dose-response axis, most related first: exact permuted copy -> continued training -> independent seed
#: (same data) -> independent seed and other pretraining images.
DOSE_SETTINGS: tuple[str, ...] = ("permuted", "continued_1ep", "continued_4ep", "independent", "pretraining")


def cache_dir(cache: str | os.PathLike | None = None) -> Path:
    """The cache folder: ``cache`` if given, else ``$FTLAB_CACHE``, else ``~/.cache/ftlab``."""
    from ftlab.data.weights import cache_dir as _cache_dir

    return _cache_dir(cache)


def cache_paths(spec: BaseSpec, cache: str | os.PathLike | None = None) -> tuple[Path, Path]:
    """``(weights, sidecar)`` paths of ``spec`` in the cache."""
    d = cache_dir(cache) / "transfer-benchmark"
    stem = f"{spec.name}-{spec.key()}"
    return d / f"{stem}.safetensors", d / f"{stem}.json"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def is_cached(spec: BaseSpec, cache: str | os.PathLike | None = None) -> bool:
    """Whether a complete, uncorrupted checkpoint of ``spec`` is in the cache."""
    weights, sidecar = cache_paths(spec, cache)
    if not (weights.exists() and sidecar.exists()):
        return False
    try:
        meta = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        return False
    return meta.get("key") == spec.key() and meta.get("sha256") == _sha256(weights)


def permuted_copy(model, seed: int):
    """A copy of ``model`` (a :class:`ftlab.models.vit.ViT`) with every hidden unit renamed, computing the same function.

    Drawn from ``seed``: one permutation of the residual stream (patch embedding outputs, class and
    position embeddings, every LayerNorm, the inputs of q/k/v/fc1/head and the outputs of out/fc2),
    and per block one of the MLP units, one of the attention heads, and within each head one of the
    q/k dimensions (shared by q and k) and one of the v dimensions (the input of ``out``).
    """
    import copy

    import torch

    m = copy.deepcopy(model)
    cfg = m.config
    d, h = cfg.width, cfg.heads
    dh = d // h
    g = torch.Generator().manual_seed(int(seed))

    def perm(n):
        return torch.randperm(n, generator=g)

    def head_perm():
        heads = perm(h)
        qk = torch.cat([heads[i] * dh + perm(dh) for i in range(h)])
        v = torch.cat([heads[i] * dh + perm(dh) for i in range(h)])
        return qk, v

    P = perm(d)
    with torch.no_grad():
        def rows(lin, idx):
            lin.weight.copy_(lin.weight[idx])
            if lin.bias is not None:
                lin.bias.copy_(lin.bias[idx])

        def cols(lin, idx):
            lin.weight.copy_(lin.weight[:, idx])

        def vec(ln, idx):
            ln.weight.copy_(ln.weight[idx])
            ln.bias.copy_(ln.bias[idx])

        rows(m.patch_embed, P)
        m.cls_token.weight.copy_(m.cls_token.weight[:, P])
        m.pos_embed.weight.copy_(m.pos_embed.weight[:, P])
        for blk in m.blocks:
            vec(blk.ln1, P)
            vec(blk.ln2, P)
            qk, v = head_perm()
            for lin, idx in ((blk.attn.q, qk), (blk.attn.k, qk), (blk.attn.v, v)):
                cols(lin, P)
                rows(lin, idx)
            cols(blk.attn.out, v)
            rows(blk.attn.out, P)
            Q = perm(blk.mlp.fc1.out_features)
            cols(blk.mlp.fc1, P)
            rows(blk.mlp.fc1, Q)
            cols(blk.mlp.fc2, Q)
            rows(blk.mlp.fc2, P)
        vec(m.ln_final, P)
        cols(m.head, P)
    return m


def pretrain(spec: BaseSpec, *, cache: str | os.PathLike | None = None):
    """Pretrain a base model from scratch, or from its ``parent`` (deterministic given ``spec``).

    Returns ``(model, metrics)``; ``metrics`` holds the final training loss, the accuracy on the
    unshifted 20-class test set and the wall time (s).
    """
    import torch

    from ftlab.experiments.training import TrainConfig, accuracy, train_
    from ftlab.experiments.transfer_accuracy.tasks import joint_test_data, pretraining_data
    from ftlab.models.vit import ViT

    t0 = time.perf_counter()
    loss = float("nan")
    if spec.parent is not None:
        model = load_base(spec.parent, cache=cache)[0]
        if model.config != spec.vit_config():
            raise ValueError(f"base {spec.name!r}: its architecture differs from its parent {spec.parent!r}")
    else:
        torch.manual_seed(spec.seed)
        model = ViT(spec.vit_config())
    if spec.epochs > 0:
        x, y = pretraining_data(spec.data, n_per_source=spec.n_per_source, seed=spec.seed)
        cfg = TrainConfig(optimizer="adamw", lr=spec.lr, weight_decay=spec.weight_decay, epochs=spec.epochs,
                          batch_size=spec.batch_size, schedule="warmup_cosine")
        res = train_(model, torch.from_numpy(x), torch.from_numpy(y), config=cfg, seed=spec.seed + 1,
                     desc=f"pretrain {spec.name}")
        loss = res.last_batch_loss
    if spec.permute_seed is not None:
        model = permuted_copy(model, spec.permute_seed)
    xe, ye = joint_test_data()
    acc = accuracy(model, torch.from_numpy(xe), torch.from_numpy(np.asarray(ye, dtype=np.int64)), batch_size=1024)
    metrics = {"final_train_loss": loss, "joint_test_accuracy": acc, "pretrain_seconds": time.perf_counter() - t0}
    log.info("pretrained %s: %s", spec.name, metrics)
    return model, metrics


def load_base(spec: BaseSpec | str, *, cache: str | os.PathLike | None = None, rebuild: bool = False):
    """Return the pretrained base ``spec`` (a name in :data:`FAMILY` or a :class:`BaseSpec`).

    Reads the cache when it holds a complete checkpoint whose sha256 matches its sidecar;
    otherwise (absent, interrupted, corrupt, or ``rebuild=True``) pretrains and writes the
    weights, then the sidecar, atomically. Returns ``(model, metrics)`` in eval mode.
    """
    import torch
    from safetensors.torch import load_file, save

    from ftlab.models.vit import ViT

    if isinstance(spec, str):
        check_choice("base", spec, list(FAMILY))
        spec = FAMILY[spec]
    weights, sidecar = cache_paths(spec, cache)
    if not rebuild and is_cached(spec, cache):
        meta = json.loads(sidecar.read_text())
        model = ViT(spec.vit_config())
        model.load_state_dict(load_file(str(weights)), strict=True)
        return model.eval(), meta["metrics"]
    if weights.exists() or sidecar.exists():
        log.warning("cache entry for %s is incomplete or corrupt: rebuilding it", spec.name)
        sidecar.unlink(missing_ok=True)
    model, metrics = pretrain(spec, cache=cache)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    atomic_write_bytes(weights, save(state, metadata={"name": spec.name, "key": spec.key()}))
    save_json(sidecar, {"name": spec.name, "key": spec.key(), "spec": dataclasses.asdict(spec),
                        "sha256": _sha256(weights), "metrics": metrics, "torch": torch.__version__})
    return model, metrics
