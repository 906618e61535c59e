"""BiCo on a randomly initialised ViT-B/16-sized model (width 768, 12 layers, MLP 3072), CPU.

Measures, side by side in one run:

1. the calibration pass with capture (both base models, forward + backward, streaming
   cross-covariances) against a plain forward + backward (``loss.backward()``) of both models over
   the same batches (goal: <= 1.3x);
2. the time of all Procrustes solves of the transfer, from the real statistics of (1): each
   distinct map shape is solved once and its time multiplied by the number of maps of that shape;
3. the peak resident memory of the calibration pass at 100 and at 1000 calibration samples, each
   in a fresh subprocess (goal: within 10%).

Small images keep it short (the token count per image does not change what is compared).
Writes the ``transfer`` section of docs/benchmarks.md.

Usage: ``python benchmarks/bench_transfer.py [--image 64] [--batch 8] [--batches 2]``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_section  # noqa: E402


class ViT(nn.Module):
    """A plain-torch ViT-B/16: patch conv, CLS token, learned positions, 12 pre-LN encoder layers."""

    def __init__(self, *, image: int, width: int = 768, depth: int = 12, heads: int = 12, mlp: int = 3072,
                 patch: int = 16, classes: int = 10, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        n = (image // patch) ** 2
        self.patch = nn.Conv2d(3, width, patch, patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width))
        self.pos_embed = nn.Parameter(0.02 * torch.randn(1, n + 1, width))
        self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(width, heads, mlp, dropout=0.0, activation="gelu",
                                                               batch_first=True, norm_first=True) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        h = self.patch(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls_token.expand(h.shape[0], -1, -1), h], 1) + self.pos_embed
        for b in self.blocks:
            h = b(h)
        return self.head(self.norm(h)[:, 0])


def ce_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def make_batches(n_batches: int, batch: int, image: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 3, image, image, generator=g), torch.randint(0, 10, (batch,), generator=g))
            for _ in range(n_batches)]


def calibrate(A, B, batches, batch_dtype=None):
    """The BiCo calibration pass exactly as ``fit_transfer`` runs it; returns (stats, pairs, specs, seconds)."""
    from ftlab.transfer.api import pair_points
    from ftlab.transfer.calibrate import collect_maps_stats
    from ftlab.transfer.layer_map import build_layer_map
    from ftlab.transfer.methods import get_method
    from ftlab.transfer.spec import infer_spec

    m = get_method("bico")
    spec_a, spec_b = infer_spec(A), infer_spec(B)
    pairs = pair_points(spec_a, spec_b, build_layer_map(A, B))
    reqs = {tp: m.requirements(spec_b.points[tp]) for tp in pairs}
    t0 = time.perf_counter()
    stats, _ = collect_maps_stats(A, B, pairs=pairs, source_spec=spec_a, target_spec=spec_b, requirements=reqs,
                                  pairs_iter=((b, b) for b in batches), total=len(batches), loss=ce_loss,
                                  batch_dtype=batch_dtype)
    return stats, time.perf_counter() - t0


def plain(A, B, batches) -> float:
    t0 = time.perf_counter()
    for b in batches:
        for model in (A, B):
            model.zero_grad(set_to_none=True)
            ce_loss(model, b).backward()
    for model in (A, B):
        model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def memory_child(n_samples: int, batch: int, image: int) -> None:
    from ftlab.transfer.api import _peak_rss_mb

    torch.set_num_threads(1)
    A, B = ViT(image=image, seed=0).eval(), ViT(image=image, seed=1).eval()
    stats, _ = calibrate(A, B, make_batches(n_samples // batch, batch, image, seed=n_samples))
    for st in stats.values():  # flush staged float32 products into the float64 sums, as the solves do
        st.cross  # noqa: B018
    print(json.dumps({"peak_rss_mb": _peak_rss_mb()}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", type=int, default=64, help="image side for the timing runs (64 -> 16 patches + CLS)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--batches", type=int, default=2, help="calibration batches in the timing runs")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--mem-image", type=int, default=16, help="image side for the memory runs (16 -> 1 patch + CLS)")
    ap.add_argument("--mem-batch", type=int, default=25)
    ap.add_argument("--memory-child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_child is not None:
        memory_child(args.memory_child, args.mem_batch, args.mem_image)
        return
    from ftlab.transfer.align import fit_map

    mem = {}  # first, in fresh processes (peak RSS of each child's own address space, VmHWM)
    for n in (100, 1000):
        out = subprocess.run([sys.executable, __file__, "--memory-child", str(n), "--mem-batch", str(args.mem_batch),
                              "--mem-image", str(args.mem_image)], capture_output=True, text=True, check=True)
        mem[n] = json.loads(out.stdout.strip().splitlines()[-1])["peak_rss_mb"]
    torch.set_num_threads(1)
    A, B = ViT(image=args.image, seed=0), ViT(image=args.image, seed=1)
    batches = make_batches(args.batches, args.batch, args.image)
    rows = args.batches * args.batch * ((args.image // 16) ** 2 + 1)
    t_plain, t_cap32, stats = [], [], None
    for _ in range(args.repeat):  # interleaved, best of each
        t_plain.append(plain(A, B, batches))
        stats, t = calibrate(A, B, batches)
        t_cap32.append(t)
    _, t_cap64 = calibrate(A, B, batches, batch_dtype=torch.float64)
    # Procrustes: one solve per distinct shape, times the number of maps of that shape
    shapes = Counter(tuple(st.cross.shape) for st in stats.values())
    per_shape = {}
    for shape in shapes:
        key = next(k for k, st in stats.items() if tuple(st.cross.shape) == shape)
        t0 = time.perf_counter()
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit_map(stats[key], source="act")
        per_shape[shape] = time.perf_counter() - t0
    t_solves = sum(per_shape[s] * c for s, c in shapes.items())
    bp, b32, b64 = min(t_plain), min(t_cap32), t_cap64
    shape_txt = ", ".join(f"{c} x ({s[0]}x{s[1]}): {per_shape[s]:.2f} s each" for s, c in sorted(shapes.items()))
    setup = (f"Randomly initialised plain-torch ViT-B/16 (width 768, 12 pre-LN layers, 12 heads, MLP 3072, patch 16) "
             f"as both source and target, float32, CPU, 1 thread. Timing runs: {args.batches} calibration batches of "
             f"{args.batch} images of {args.image}x{args.image} px ({rows} token rows per model), best of {args.repeat} "
             f"interleaved repeats. Memory runs: {args.mem_image}x{args.mem_image} px images, batches of "
             f"{args.mem_batch}, each run in a fresh process (peak resident memory, `VmHWM`): calibration pass and the "
             "float64 statistics, no solves.")
    rows_md = [
        ("plain forward + backward, both models", f"{bp:.2f} s", ""),
        ("calibration with capture (float32 batch products, float64 sums; the default for float32 models)",
         f"{b32:.2f} s (**{b32 / bp:.2f}x**)", "<= 1.3x"),
        ("calibration with capture, float64 batch products (`batch_dtype=torch.float64`)",
         f"{b64:.2f} s ({b64 / bp:.2f}x)", ""),
        (f"all Procrustes solves ({sum(shapes.values())} maps, float64 SVD)", f"{t_solves:.1f} s", ""),
        ("peak memory, 100 calibration samples", f"{mem[100]:.0f} MB", ""),
        ("peak memory, 1000 calibration samples", f"{mem[1000]:.0f} MB (**{100 * (mem[1000] / mem[100] - 1):+.1f}%**)",
         "within 10%"),
    ]
    table = "\n".join(["| measurement | value | goal |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows_md])
    md = f"""## Task-vector transfer (BiCo) on a ViT-B/16-sized model

{setup}

{table}

Procrustes solves, per shape (each shape solved once, multiplied by its count): {shape_txt}.
The capture pass skips weight gradients (autograd is asked only for gradients at the layer
outputs), which pays for part of the cross-covariance products; the 3072-wide MLP spaces dominate
both the statistics (two 3072 x 3072 cross-covariances per block) and the solves.
"""
    write_section("transfer", md)
    print(md)


if __name__ == "__main__":
    main()
