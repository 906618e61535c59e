"""The cost of a BiCo fit against the forward-backward pass it rests on, side by side in one run.

Compared in every part: ftlab's default path (rows kept for wide maps seen by few rows, factored
solves, parallel solves) and the **reference**, today's path kept runnable by two options
(``statistics="dense"``: float64 cross-covariance sums for every map; ``solver="dense"``: SVDs of the
full ``d_A x d_B`` cross-covariances, with the same completion rule).

1. **EfficientNet-Lite0 -> Lite2** (ImageNet weights; skipped when the weight packages are missing):
   100 random 64-px images in batches of 25, a 10-class head on the pooled features; a plain
   forward + backward of both bases over the same batches, the reference fit and the default fit
   (calibration, solves, transport), 2 threads. Peak memory of each fit in a fresh process.
2. **ViT-B/16-sized** random models (width 768, 12 layers, MLP 3072), 2 batches of 8 images of 64 px
   (272 token rows), 1 thread: calibration (reference and default) against a plain forward +
   backward; all solves of the default path; the reference solves timed once per distinct map
   (shape, statistic, completion chain) and multiplied by its count.
3. **Scaling**: Llama-style decoders built from ``transformers`` configs (2 layers, grouped-query
   attention, hidden width 256 -> 2048) at a fixed 128 token rows, and at width 1024 from 64 to 2048
   rows; fit time, calibration time and peak memory, each point in a fresh process; a log-log plot
   and the fitted exponents.
4. **GPU** (when CUDA is available): the ViT-B/16-sized fit with the models on the GPU.
5. **Accuracy**: the relative error of the transferred task vector on an exact permuted copy and a
   self-transfer (a float32 OpenCLIP-style ViT), for the default and the reference path.

Usage: ``python benchmarks/bench_transfer.py [--quick]`` (``--quick``: small sizes, no docs written).
Writes the ``transfer`` section of docs/benchmarks.md and docs/figures/transfer-scaling.png.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine  # noqa: E402
from ftlab.core.validate import peak_rss_mb  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = {"statistics": "dense", "solver": "dense"}


class ViT(nn.Module):
    """A plain-torch ViT-B/16: patch conv, CLS token, learned positions, pre-LN encoder layers."""

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


def lm_loss(model, batch):
    return model(**batch).loss


def image_batches(n_batches: int, batch: int, image: int, seed: int = 0, device: str = "cpu"):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 3, image, image, generator=g).to(device),
             torch.randint(0, 10, (batch,), generator=g).to(device)) for _ in range(n_batches)]


def plain(models, batches, loss) -> float:
    """One forward + backward of each model over the batches (weight gradients included)."""
    t0 = time.perf_counter()
    for b in batches:
        for m in models:
            loss(m, b).backward()
    for m in models:
        m.zero_grad(set_to_none=True)
    _sync()
    return time.perf_counter() - t0


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def shifted(model, scale=1e-3, seed=0):
    import copy

    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g).to(p))
    return out


def fit(A, A_ft, B, batches, loss, reference: bool):
    from ftlab.transfer import TransferOptions, fit_transfer, get_method

    m = get_method("bico", solver="dense" if reference else "auto")
    opts = TransferOptions(statistics="dense" if reference else "auto")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = fit_transfer(A, A_ft, B, batches, loss, method=m, options=opts)
    _sync()
    return res


def child(args: list[str]) -> dict:
    """Run this script with ``args`` in a fresh process; its last stdout line is JSON."""
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"child {args} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# --- 1. EfficientNet-Lite0 -> Lite2 -----------------------------------------------------------------------


class Classifier(nn.Module):
    def __init__(self, enc, classes=10):
        super().__init__()
        self.enc, self.head = enc, nn.Linear(1280, classes)

    def forward(self, x):
        return self.head(self.enc.features(x))


def lite_models(device="cpu"):
    from ftlab.experiments.transfer_accuracy.vision import load_efficientnet

    torch.manual_seed(0)
    A, B = Classifier(load_efficientnet("lite0")).eval(), Classifier(load_efficientnet("lite2")).eval()
    return A.to(device), shifted(A, seed=1).to(device), B.to(device)


def lite_child(reference: bool) -> dict:
    torch.set_num_threads(2)
    A, A_ft, B = lite_models()
    res = fit(A, A_ft, B, image_batches(4, 25, 64), ce_loss, reference)
    return {"peak_rss_mb": peak_rss_mb(), "time_s": res.time_s}


def lite_part(repeat: int) -> dict | None:
    try:
        A, A_ft, B = lite_models()
    except Exception as exc:  # noqa: BLE001 - weights not installed: the part is skipped and says why
        print(f"EfficientNet-Lite part skipped: {exc}")
        return None
    torch.set_num_threads(2)
    batches = image_batches(4, 25, 64)
    rows = []
    for _ in range(repeat):  # interleaved; best of each
        rows.append({"plain": plain((A, B), batches, ce_loss), "ref": fit(A, A_ft, B, batches, ce_loss, True),
                     "new": fit(A, A_ft, B, batches, ce_loss, False)})
    best = {"plain": min(r["plain"] for r in rows)}
    for k in ("ref", "new"):
        r = min((x[k] for x in rows), key=lambda res: res.time_s)
        best[k] = {**r.timings, "total_s": r.time_s}
    ref_tv, new_tv = rows[-1]["ref"].task_vector, rows[-1]["new"].task_vector
    best["agreement"] = (sum(float((ref_tv[k] - new_tv[k]).double().pow(2).sum()) for k in ref_tv) ** 0.5
                         / ref_tv.norm())
    best["mem"] = {k: child(["--lite-child", k])["peak_rss_mb"] for k in ("ref", "new")}
    return best


# --- 2. ViT-B/16-sized ----------------------------------------------------------------------------------


def vit_problem(A, B):
    from ftlab.transfer.api import pair_points, target_entries
    from ftlab.transfer.layer_map import build_layer_map
    from ftlab.transfer.problem import TransferProblem
    from ftlab.transfer.spec import infer_spec

    sa, sb = infer_spec(A), infer_spec(B)
    lmap = build_layer_map(A, B)
    return TransferProblem(lmap, target_entries(B), sa, sb, pair_points(sa, sb, lmap))


def calibrate(problem, A, B, batches, reference: bool):
    from ftlab.transfer import TransferOptions, get_method
    from ftlab.transfer.batches import CalibrationData
    from ftlab.transfer.calibrate import collect_map_statistics

    m = get_method("bico")
    reqs = {tp: m.requirements(problem.target_spec.points[tp]) for tp in problem.pairs}
    opts = TransferOptions(statistics="dense" if reference else "auto")
    t0 = time.perf_counter()
    stats, _ = collect_map_statistics(problem, reqs, A, B, CalibrationData(batches), ce_loss, opts)
    _sync()
    return stats, time.perf_counter() - t0


def reference_solves(problem, stats) -> tuple[float, dict]:
    """Today's solves: each distinct (shape, statistic, chain) once with the dense solver, times its count."""
    from ftlab.transfer import get_method
    from ftlab.transfer.align import fit_map

    m = get_method("bico")
    groups: Counter = Counter()
    example = {}
    for tp in problem.pairs:  # today's code solved every map, also those that read the same statistics
        for _, st, chain, label, _ in m.solves(tp, problem.target_spec.points[tp], stats):
            key = (st.a.dim, st.b.dim, label, tuple(lab for lab, _ in chain))
            groups[key] += 1
            example.setdefault(key, (st, chain, label))
    per = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for key, (st, chain, label) in example.items():
            t0 = time.perf_counter()
            fit_map(st, source=label, completion=chain, solver="dense")
            per[key] = time.perf_counter() - t0
    return sum(per[k] * c for k, c in groups.items()), [[a, b, lab, list(ch), c, per[(a, b, lab, ch)]]
                                                        for (a, b, lab, ch), c in groups.items()]


def vit_part(image: int, batch: int, n_batches: int, size: dict, device: str = "cpu") -> dict:
    from ftlab.transfer import get_method

    torch.set_num_threads(1)
    A = ViT(image=image, seed=0, **size).to(device)
    B = ViT(image=image, seed=1, **size).to(device)
    batches = image_batches(n_batches, batch, image, device=device)
    problem = vit_problem(A, B)
    out = {"plain": min(plain((A, B), batches, ce_loss) for _ in range(2))}
    _, out["cal_ref"] = calibrate(problem, A, B, batches, True)
    stats_ref, _ = calibrate(problem, A, B, batches, True)
    stats, out["cal_new"] = calibrate(problem, A, B, batches, False)
    m = get_method("bico")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        fitted = m.prepare(problem, stats)
        _sync()
        out["solve_new"] = time.perf_counter() - t0
    out["factored"] = sum(1 for pair in fitted.fits.values() for f in pair if f is not None and hasattr(f.R, "rmul"))
    out["maps"] = sum(1 for pair in fitted.fits.values() for f in pair if f is not None)
    if device == "cpu":
        out["solve_ref"], out["per_shape"] = reference_solves(problem, stats_ref)
    out["rows"] = n_batches * batch * ((image // 16) ** 2 + 1)
    return out


# --- 3. scaling with width and rows -----------------------------------------------------------------------


def llama(width: int, seed: int):
    import transformers

    heads = max(2, width // 64)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=width, intermediate_size=int(2.75 * width) // 8 * 8,
                                   num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=heads // 2,
                                   max_position_embeddings=4096, tie_word_embeddings=False, attn_implementation="eager")
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).eval()


def scaling_child(width: int, rows: int, threads: int) -> dict:
    torch.set_num_threads(threads)
    A, B = llama(width, 0), llama(width, 1)
    A_ft = shifted(A, seed=2)
    seq = 32
    g = torch.Generator().manual_seed(3)
    batches = [{"input_ids": (x := torch.randint(0, 256, (max(1, min(4, rows // seq)), seq), generator=g)), "labels": x}
               for _ in range(max(1, rows // (seq * 4)))]
    res = fit(A, A_ft, B, batches, lm_loss, False)
    t_plain = plain((A, B), batches, lm_loss)
    return {"width": width, "rows": sum(int(b["input_ids"].numel()) for b in batches), "plain_s": t_plain,
            "calibration_s": res.timings["calibration_s"], "fit_s": res.timings["fit_s"], "total_s": res.time_s,
            "peak_rss_mb": peak_rss_mb()}


def slope(xs, ys) -> float:
    import numpy as np

    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def scaling_part(widths, rows_list, width_for_rows: int, threads: int) -> dict:
    by_width = [child(["--scaling-child", str(w), "128", str(threads)]) for w in widths]
    by_rows = [child(["--scaling-child", str(width_for_rows), str(r), str(threads)]) for r in rows_list]
    return {"width": by_width, "rows": by_rows}


def scaling_figure(sc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((axes[0], "width", "hidden width"), (axes[1], "rows", "calibration rows (tokens)")):
        pts = sc[key]
        x = [p[key] for p in pts]
        for field, name in (("fit_s", "solves"), ("calibration_s", "calibration pass"), ("plain_s", "forward+backward")):
            ax.loglog(x, [p[field] for p in pts], "o-", label=f"{name} (slope {slope(x, [p[field] for p in pts]):.2f})")
        ax2 = ax.twinx()
        ax2.loglog(x, [p["peak_rss_mb"] for p in pts], "k--", alpha=0.5)
        ax2.set_ylabel("peak memory (MB), dashed")
        ax.set_xlabel(label)
        ax.set_ylabel("seconds")
        ax.legend(fontsize=8, loc="upper left")
    axes[0].set_title("Llama-style decoders, 128 rows")
    axes[1].set_title(f"width {sc['rows'][0]['width']}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- 5. accuracy ----------------------------------------------------------------------------------------


def permuted_copy_errors(seed: int = 0) -> list[tuple[str, float, float]]:
    """Relative error of tau_B on an exact unit-permuted copy and on a self-transfer (float32 models).

    A 4-layer OpenCLIP-style ViT (width 64, 4 heads, MLP 256, a bare ``x @ proj``) in float32; B permutes
    every hidden space (heads kept whole). 256 images of 16 px in 8 batches.
    """
    import copy

    sys.path.insert(0, str(ROOT / "tests" / "transfer"))
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
        for name, kw in (("default", {}), ("reference", REFERENCE)):
            tv = transfer(A, A_ft, B, batches, ce_loss, **kw)
            ts = transfer(A, A_ft, copy.deepcopy(A), batches, ce_loss, **kw)
            out.append((name, rel_err(tv, truth), rel_err(ts, {k: v.double() for k, v in tau.items()})))
    return out


# --- the report -----------------------------------------------------------------------------------------


def _x(a: float, b: float) -> str:
    return f"{a / b:.2f}x"


def markdown(lite, vit, sc, gpu, errors, wall, quick) -> str:
    parts = ["## Task-vector transfer (BiCo): the fit against the forward-backward it rests on", "",
             "Reference = today's path kept runnable (`statistics=\"dense\"`, `solver=\"dense\"`); default = rows kept "
             "for wide maps seen by few rows, factored solves, parallel solves. Ratios are to a plain forward + "
             "backward of both bases over the same batches, measured in the same run."]
    if lite is not None:
        p = lite["plain"]
        r, n = lite["ref"], lite["new"]
        parts += ["", "### EfficientNet-Lite0 -> Lite2 (ImageNet weights), 100 images of 64 px in batches of 25, 2 threads",
                  "", "| stage | reference | default | goal |", "|---|---|---|---|",
                  f"| plain forward + backward, both bases | {p:.2f} s | | |",
                  f"| calibration | {r['calibration_s']:.2f} s ({_x(r['calibration_s'], p)}) | "
                  f"{n['calibration_s']:.2f} s (**{_x(n['calibration_s'], p)}**) | <= 2x |",
                  f"| solves | {r['fit_s']:.2f} s ({_x(r['fit_s'], p)}) | {n['fit_s']:.2f} s ({_x(n['fit_s'], p)}) | |",
                  f"| transport | {r['apply_s']:.2f} s | {n['apply_s']:.2f} s | |",
                  f"| **whole fit** | {r['total_s']:.2f} s ({_x(r['total_s'], p)}) | {n['total_s']:.2f} s "
                  f"(**{_x(n['total_s'], p)}**) | <= 4x |",
                  f"| peak memory (fresh process) | {lite['mem']['ref']:.0f} MB | **{lite['mem']['new']:.0f} MB** "
                  "| <= 1 GB |",
                  "", f"The two task vectors differ by {lite['agreement']:.1e} (relative)."]
    if vit is not None:
        p = vit["plain"]
        parts += ["", f"### ViT-B/16-sized random models, {vit['rows']} token rows, 1 thread", "",
                  "| measurement | reference | default | goal |", "|---|---|---|---|",
                  f"| plain forward + backward, both models | {p:.2f} s | | |",
                  f"| calibration | {vit['cal_ref']:.2f} s ({_x(vit['cal_ref'], p)}) | {vit['cal_new']:.2f} s "
                  f"(**{_x(vit['cal_new'], p)}**) | <= 1.6x |",
                  f"| all solves ({vit['maps']} maps; {vit['factored']} factored by default) | "
                  f"{vit.get('solve_ref', math.nan):.1f} s (per distinct map, times its count) | {vit['solve_new']:.1f} s "
                  f"(**{100 * vit['solve_new'] / vit.get('solve_ref', math.nan):.1f}%**) | <= 5% |"]
        if vit.get("per_shape"):
            shapes = "; ".join(f"{c} x {a}x{b} {lab} [{', '.join(ch)}]: {t:.2f} s" for a, b, lab, ch, c, t in
                               sorted(vit["per_shape"], key=lambda x: -x[4] * x[5]))
            parts += ["", f"Reference solves per distinct map: {shapes}."]
    if sc is not None:
        w, r = sc["width"], sc["rows"]
        xs = [p["width"] for p in w]
        parts += ["", "### Scaling: Llama-style decoders (2 layers, grouped-query attention) from `transformers` configs",
                  "",
                  "| hidden width | rows | forward+backward | calibration | solves | whole fit | peak memory |",
                  "|---|---|---|---|---|---|---|"]
        parts += [f"| {p['width']} | {p['rows']} | {p['plain_s']:.2f} s | {p['calibration_s']:.2f} s | {p['fit_s']:.2f} s | "
                  f"{p['total_s']:.2f} s | {p['peak_rss_mb']:.0f} MB |" for p in w + r]
        parts += ["", f"Fitted exponents (log-log slope) against width at 128 rows: solves "
                  f"{slope(xs, [p['fit_s'] for p in w]):.2f}, calibration {slope(xs, [p['calibration_s'] for p in w]):.2f}, "
                  f"forward+backward {slope(xs, [p['plain_s'] for p in w]):.2f}, peak memory "
                  f"{slope(xs, [p['peak_rss_mb'] for p in w]):.2f}; against rows at width {r[0]['width']}: solves "
                  f"{slope([p['rows'] for p in r], [p['fit_s'] for p in r]):.2f}, calibration "
                  f"{slope([p['rows'] for p in r], [p['calibration_s'] for p in r]):.2f}.",
                  "", "![fit time and memory against width and rows](figures/transfer-scaling.png)"]
    if gpu is not None:
        parts += ["", "### On the GPU", "", f"ViT-B/16-sized, {gpu['rows']} token rows, models and batches on "
                  f"{gpu['device']}: plain forward + backward {gpu['plain']:.3f} s, calibration {gpu['cal_new']:.3f} s "
                  f"({_x(gpu['cal_new'], gpu['plain'])}), all solves {gpu['solve_new']:.2f} s ({gpu['factored']} of "
                  f"{gpu['maps']} maps factored); statistics and solves stay on the device."]
    rows_e = "\n".join(f"| {name} | {e:.1e} | {s:.1e} |" for name, e, s in errors)
    parts += ["", "### Accuracy", "", "Relative error of the transferred task vector on an exact unit-permuted copy of a "
              "float32 OpenCLIP-style ViT (width 64, 4 layers, MLP 256, bare `x @ proj`), 256 calibration images, and of a "
              "self-transfer:", "", "| path | permuted copy | self-transfer |", "|---|---|---|", rows_e, "",
              f"Whole benchmark: {wall:.0f} s wall{' (quick sizes)' if quick else ''}."]
    return "\n".join(parts)


def merged(files: list[str]) -> dict:
    """The measurements of several runs (``--json`` files) in one: a part measured later replaces an earlier one."""
    raw: dict = {}
    for f in files:
        for k, v in json.loads(Path(f).read_text()).items():
            if v:
                raw[k] = v
    return raw


def write_docs(raw: dict) -> str:
    md = markdown(raw.get("lite"), raw.get("vit"), raw.get("scaling"), raw.get("gpu"), raw.get("errors", []),
                  raw.get("wall", math.nan), False)
    if raw.get("scaling"):
        scaling_figure(raw["scaling"], ROOT / "docs" / "figures" / "transfer-scaling.png")
    from _common import replace_block

    body = f"{md.strip()}\n\n*Measured {raw.get('date', time.strftime('%Y-%m-%d'))} on: {raw.get('machine', '?')}.*"
    replace_block(ROOT / "docs" / "benchmarks.md", "<!-- BEGIN transfer -->", "<!-- END transfer -->", body)
    return md


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run); docs are not written")
    ap.add_argument("--parts", default="lite,vit,scaling,gpu,accuracy", help="comma-separated parts to run")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--lite-child", choices=["ref", "new"], help=argparse.SUPPRESS)
    ap.add_argument("--scaling-child", nargs=3, type=int, help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None, help="also write the raw measurements to this file")
    ap.add_argument("--docs-from", nargs="+", default=None, metavar="JSON",
                    help="write docs/benchmarks.md and the figure from the raw measurements of earlier runs (merged)")
    args = ap.parse_args()
    if args.lite_child:
        print(json.dumps(lite_child(args.lite_child == "ref")))
        return
    if args.scaling_child:
        print(json.dumps(scaling_child(*args.scaling_child)))
        return
    if args.docs_from:
        print(write_docs(merged(args.docs_from)))
        return
    parts = set(args.parts.split(","))
    t0 = time.perf_counter()
    size = {"width": 768, "depth": 12, "heads": 12, "mlp": 3072} if not args.quick else \
        {"width": 128, "depth": 2, "heads": 2, "mlp": 512}
    raw: dict = {"machine": machine(), "date": time.strftime("%Y-%m-%d")}

    def save() -> None:  # after every part, so that a run stopped early keeps what it measured
        raw["wall"] = time.perf_counter() - t0
        if args.json:
            Path(args.json).write_text(json.dumps(raw, indent=1, default=str))

    for part in args.parts.split(","):
        if part == "gpu" and torch.cuda.is_available():
            raw["gpu"] = {**vit_part(64, 8, 2, size, device="cuda"), "device": torch.cuda.get_device_name()}
        elif part == "lite" and not args.quick:
            raw["lite"] = lite_part(args.repeat)
        elif part == "vit":
            raw["vit"] = vit_part(64, 8, 2, size)
        elif part == "scaling":
            widths, rows = ((256, 512, 1024, 2048), (64, 128, 256, 512, 1024)) if not args.quick else \
                ((128, 256), (64, 128))
            raw["scaling"] = scaling_part(widths, rows, 1024 if not args.quick else 256, threads=2)
        elif part == "accuracy":
            raw["errors"] = permuted_copy_errors()
        save()
    if not args.quick and parts >= {"lite", "vit", "scaling", "accuracy"}:
        print(write_docs(raw))
    else:
        print(markdown(raw.get("lite"), raw.get("vit"), raw.get("scaling"), raw.get("gpu"), raw.get("errors", []),
                       raw["wall"], args.quick))


if __name__ == "__main__":
    main()
