"""BiCo on a randomly initialised ViT-B/16-sized model (width 768, 12 layers, MLP 3072), CPU.

Measures, side by side in one run:

1. the calibration pass with capture (both base models, forward + backward, streaming
   cross-covariances) against a plain forward + backward (``loss.backward()``) of both models over
   the same batches (goal: <= 1.3x), with float64 batch products (the default) and with float32
   staging (opt-in);
2. the time of all Procrustes solves of the transfer, from the real statistics of (1): each
   distinct map shape is solved once and its time multiplied by the number of maps of that shape;
   and, for one rank-deficient map, the cost of the completion rule;
3. the peak resident memory of the calibration pass (float64 default) at 100 and at 1000
   calibration samples, each in a fresh subprocess (goal: within 10%);
4. the accuracy cost of float32 staging: the relative error of the transferred task vector on an
   exact unit-permuted copy of a float32 ViT (width 64, 4 layers), and of a self-transfer, with
   float64 products and with float32 staging, with and without the completion rule.

Small images keep it short (the token count per image does not change what is compared).
Writes the ``transfer`` section of docs/benchmarks.md.

Usage: ``python benchmarks/bench_transfer.py [--image 64] [--batch 8] [--batches 2]``
(run it under ``flock /tmp/ftlab-cpu.lock`` on a shared machine).
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


def calibrate(A, B, batches, batch_dtype="float64"):
    """The BiCo calibration pass as ``fit_transfer`` runs it (``batch_dtype``: "float64", or "float32" staging).

    Returns ``(stats, seconds)``.
    """
    from ftlab.transfer import TransferOptions
    from ftlab.transfer.api import pair_points, target_entries
    from ftlab.transfer.batches import CalibrationData
    from ftlab.transfer.calibrate import collect_map_statistics
    from ftlab.transfer.layer_map import build_layer_map
    from ftlab.transfer.methods import get_method
    from ftlab.transfer.problem import TransferProblem
    from ftlab.transfer.spec import infer_spec

    m = get_method("bico")
    spec_a, spec_b = infer_spec(A), infer_spec(B)
    lmap = build_layer_map(A, B)
    pairs = pair_points(spec_a, spec_b, lmap)
    problem = TransferProblem(lmap, target_entries(B), spec_a, spec_b, pairs)
    reqs = {tp: m.requirements(spec_b.points[tp]) for tp in pairs}
    opts = TransferOptions(batch_dtype=batch_dtype)
    t0 = time.perf_counter()
    stats, _ = collect_map_statistics(problem, reqs, A, B, CalibrationData(batches), ce_loss, opts)
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


def memory_child(n_samples: int, batch: int, image: int, size: dict) -> None:
    from ftlab.transfer.api import _peak_rss_mb

    torch.set_num_threads(1)
    A, B = ViT(image=image, seed=0, **size).eval(), ViT(image=image, seed=1, **size).eval()
    stats, _ = calibrate(A, B, make_batches(n_samples // batch, batch, image, seed=n_samples))
    for st in stats.values():  # flush any staged products into the float64 sums, as the solves do
        st.covariance()
    print(json.dumps({"peak_rss_mb": _peak_rss_mb()}))


def permuted_copy_errors(seed: int = 0) -> list[tuple[str, str, float, float]]:
    """Relative error of tau_B on an exact unit-permuted copy and on a self-transfer (float32 models).

    A 4-layer OpenCLIP-style ViT (width 64, 4 heads, MLP 256, a bare ``x @ proj``, LayerNorms) in
    float32; B permutes every hidden space (heads kept whole). 256 images of 16 px in 8 batches.
    Returns ``(batch_dtype, complete, error on the permuted copy, error of the self-transfer)``.
    """
    import copy
    import warnings

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "transfer"))
    from test_transfer_exact import ClipViT, head_perm, permute_state, perturb_, rel_err, vit_axes

    from ftlab.transfer import TaskVector, transfer

    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    d, heads, ff, depth, emb = 64, 4, 256, 4, 32
    A = ClipViT(d=d, heads=heads, ff=ff, depth=depth, emb=emb, classes=10, patch=4, image=16)
    perms = {"res": torch.randperm(d, generator=g), "emb": torch.randperm(emb, generator=g)}
    for i in range(depth):
        hp = torch.randperm(heads, generator=g)
        perms[f"qk{i}"], perms[f"v{i}"] = head_perm(heads, d // heads, hp, g), head_perm(heads, d // heads, hp, g)
        perms[f"ff{i}"] = torch.randperm(ff, generator=g)
    axes = vit_axes(depth)
    B = ClipViT(d=d, heads=heads, ff=ff, depth=depth, emb=emb, classes=10, patch=4, image=16)
    B.load_state_dict(permute_state(A.state_dict(), axes, perms))
    A_ft = perturb_(copy.deepcopy(A), 5, scale=0.01, skip=(r"class_embedding", r"positional_embedding"))
    tau = TaskVector.from_models(A, A_ft)
    truth = permute_state({k: v.double() for k, v in tau.items()}, axes, perms)
    batches = [(torch.randn(32, 3, 16, 16, generator=g), torch.randint(0, 10, (32,), generator=g)) for _ in range(8)]
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for bd in ("float64", "float32"):
            for comp in ("auto", "none"):
                tv = transfer(A, A_ft, B, batches, ce_loss, batch_dtype=bd, complete=comp)
                ts = transfer(A, A_ft, copy.deepcopy(A), batches, ce_loss, batch_dtype=bd, complete=comp)
                out.append((bd, comp, rel_err(tv, truth), rel_err(ts, {k: v.double() for k, v in tau.items()})))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", type=int, default=64, help="image side for the timing runs (64 -> 16 patches + CLS)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--batches", type=int, default=2, help="calibration batches in the timing runs")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--mem-image", type=int, default=16, help="image side for the memory runs (16 -> 1 patch + CLS)")
    ap.add_argument("--mem-batch", type=int, default=25)
    ap.add_argument("--width", type=int, default=768, help="ViT width (MLP 4x, heads width/64); smaller for a smoke run")
    ap.add_argument("--depth", type=int, default=12)
    ap.add_argument("--memory-child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    size = {"width": args.width, "depth": args.depth, "heads": max(1, args.width // 64), "mlp": 4 * args.width}
    if args.memory_child is not None:
        memory_child(args.memory_child, args.mem_batch, args.mem_image, size)
        return
    import warnings

    from ftlab.transfer.align import fit_map

    t_start = time.perf_counter()
    mem = {}  # first, in fresh processes (peak RSS of each child's own address space, VmHWM)
    for n in (100, 1000):
        out = subprocess.run([sys.executable, __file__, "--memory-child", str(n), "--mem-batch", str(args.mem_batch),
                              "--mem-image", str(args.mem_image), "--width", str(args.width), "--depth", str(args.depth)],
                             capture_output=True, text=True, check=True)
        mem[n] = json.loads(out.stdout.strip().splitlines()[-1])["peak_rss_mb"]
    torch.set_num_threads(1)
    A, B = ViT(image=args.image, seed=0, **size), ViT(image=args.image, seed=1, **size)
    batches = make_batches(args.batches, args.batch, args.image)
    rows = args.batches * args.batch * ((args.image // 16) ** 2 + 1)
    t_plain, t_cap64, t_cap32, stats = [], [], [], None
    for _ in range(args.repeat):  # interleaved, best of each
        t_plain.append(plain(A, B, batches))
        stats, t = calibrate(A, B, batches)
        t_cap64.append(t)
        _, t = calibrate(A, B, batches, batch_dtype="float32")
        t_cap32.append(t)
    assert stats is not None
    # Procrustes: one plain solve per distinct shape (no completion), times the number of maps of that shape
    # the maps BiCo fits: input activations and output gradients of every point (an accumulator may serve several)
    prim = {k: st for k, st in stats.items() if (k[1], k[2]) in (("in", "act"), ("out", "grad"))}
    shapes = Counter((st.a.dim, st.b.dim) for st in prim.values())
    per_shape = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for shape in shapes:
            key = next(k for k, st in prim.items() if (st.a.dim, st.b.dim) == shape)
            t0 = time.perf_counter()
            fit_map(prim[key], source="act", completion=())
            per_shape[shape] = time.perf_counter() - t0
        # the completion rule on a rank-deficient 768-wide gradient map (272 rows): the map, then its chain
        w = args.width
        key = next(k for k in prim if k[1] == "out" and (prim[k].a.dim, prim[k].b.dim) == (w, w))
        act = stats[(key[0], "out", "act")]
        t0 = time.perf_counter()
        plain_fit = fit_map(stats[key], source="grad", completion=())
        t_plain_solve = time.perf_counter() - t0
        t0 = time.perf_counter()
        full_fit = fit_map(stats[key], source="grad", completion=(("act", act), ("naive", None)))
        t_full_solve = time.perf_counter() - t0
    t_solves = sum(per_shape[s] * c for s, c in shapes.items())
    errors = permuted_copy_errors()
    bp, b64, b32 = min(t_plain), min(t_cap64), min(t_cap32)
    shape_txt = ", ".join(f"{c} x ({s[0]}x{s[1]}): {per_shape[s]:.2f} s each" for s, c in sorted(shapes.items()))
    setup = (f"Randomly initialised plain-torch ViT (width {args.width}, {args.depth} pre-LN layers, {size['heads']} heads, "
             f"MLP {size['mlp']}, patch 16; ViT-B/16 at the defaults) "
             f"as both source and target, float32, CPU, 1 thread. Timing runs: {args.batches} calibration batches of "
             f"{args.batch} images of {args.image}x{args.image} px ({rows} token rows per model), best of {args.repeat} "
             f"interleaved repeats. Memory runs: {args.mem_image}x{args.mem_image} px images, batches of "
             f"{args.mem_batch}, each run in a fresh process (peak resident memory, `VmHWM`): calibration pass and the "
             "float64 statistics (default precision), no solves.")
    rows_md = [
        ("plain forward + backward, both models", f"{bp:.2f} s", ""),
        ("calibration with capture, float64 batch products (**the default**, `batch_dtype=\"float64\"`)",
         f"{b64:.2f} s (**{b64 / bp:.2f}x**)", "<= 1.3x"),
        ("calibration with capture, float32 staging (opt-in, `batch_dtype=\"float32\"`)",
         f"{b32:.2f} s ({b32 / bp:.2f}x)", ""),
        (f"all Procrustes solves ({sum(shapes.values())} maps, float64 SVD, no completion)", f"{t_solves:.1f} s", ""),
        (f"one {w} x {w} gradient map determined on {plain_fit.rank} of {w} dimensions: solve alone / with the "
         f"completion rule ({', '.join(f'{a} {n}' for a, n in full_fit.completed)})",
         f"{t_plain_solve:.2f} s / {t_full_solve:.2f} s", ""),
        ("peak memory, 100 calibration samples", f"{mem[100]:.0f} MB", ""),
        ("peak memory, 1000 calibration samples", f"{mem[1000]:.0f} MB (**{100 * (mem[1000] / mem[100] - 1):+.1f}%**)",
         "within 10%"),
    ]
    table = "\n".join(["| measurement | value | goal |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows_md])
    err_rows = "\n".join(f"| `{bd}` | `{comp}` | {e:.1e} | {s:.1e} |" for bd, comp, e, s in errors)
    md = f"""## Task-vector transfer (BiCo) on a ViT-B/16-sized model

{setup}

{table}

Procrustes solves, per shape (each shape solved once, multiplied by its count): {shape_txt}.
The capture pass skips weight gradients (autograd is asked only for gradients at the layer
outputs) and forms the input statistics of q, k and v once (their rows are the same tensor); the
3072-wide MLP spaces dominate both the statistics (two 3072 x 3072 cross-covariances per block) and
the solves. Float64 products cost about twice float32 products on this CPU, and the statistics
(about 42 x N x 768^2 multiply-adds per block and model pair) are as large as the forward-backward
itself (72 x N x 768^2 for both models), so the float64 default does not meet the 1.3x goal here;
float32 staging does, at the accuracy cost below. A map that the statistics determine on fewer
dimensions than its width costs up to two more SVDs, on the undetermined subspace.

Accuracy of the transferred task vector (relative error) on an exact unit-permuted copy of a
float32 OpenCLIP-style ViT (width 64, 4 layers, MLP 256, bare `x @ proj`), 256 calibration images,
and on a self-transfer of the same model:

| `batch_dtype` | `complete` | permuted copy | self-transfer |
|---|---|---|---|
{err_rows}

Whole benchmark: {time.perf_counter() - t_start:.0f} s wall.
"""
    if args.width == 768 and args.depth == 12:
        write_section("transfer", md)
    print(md)


if __name__ == "__main__":
    main()
