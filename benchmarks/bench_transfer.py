"""The cost of a BiCo fit against the forward-backward pass it rests on, side by side in one run.

Parts 1-3 compare the **earlier** code (commit ``EARLIER``, checked out in a temporary git worktree that is
removed afterwards) with **today's** (this checkout's ``src/``): every measurement runs in a fresh process
whose ``PYTHONPATH`` starts with one version's ``src/``, rounds alternate the order earlier / today, and the
report gives each repetition, medians, and the median of the per-round ratios (robust to other load on the
machine; the load average is recorded). Options the earlier API lacks are not used (library defaults, or the
options each version's CLI passes).

1. **EfficientNet-Lite0 -> Lite2** (ImageNet weights; skipped when the weight packages are missing):
   100 random 64-px images in batches of 25, a 10-class head on the pooled features, a full-model task
   vector; calibration, solves, transport, whole fit and peak memory of ``fit_transfer`` against a plain
   forward + backward of both bases over the same batches (same process, after the fit), 2 threads.
2. **paraphrase-MiniLM-L3-v2 -> all-MiniLM-L6-v2** (:mod:`ftlab.data.text` loaders): 100 WordNet glosses of
   at most 64 tokens in batches of 25, mean pooling and a supersense head, a rank-8 task vector on q and v.
3. **diagnose against transfer** on both pairs: the API calls of ``ftlab transfer --diagnose`` and of
   ``ftlab transfer`` in each version, wall time and peak memory.
4. **ViT-B/16-sized** random models (today's code only; width 768, 12 layers, MLP 3072), 272 token rows,
   1 thread: calibration against a plain forward + backward; all solves of the default path; the dense
   reference (``statistics="dense"``, ``solver="dense"``) timed once per distinct map times its count.
5. **Scaling**: Llama-style decoders built from ``transformers`` configs (2 layers, grouped-query
   attention, hidden width 256 -> 2048) at a fixed 128 token rows, and at width 1024 from 64 to 1024
   rows; fit time, calibration time and peak memory, each point in a fresh process; a log-log plot
   and the fitted exponents.
6. **GPU** (when CUDA is available): the ViT-B/16-sized fit with the models on the GPU.
7. **Accuracy**: the relative error of the transferred task vector on an exact permuted copy and a
   self-transfer (a float32 OpenCLIP-style ViT), for the default and the reference path.
8. **Solver agreement on real statistics** (today's code; the Lite pair of part 1, 1 thread): every distinct
   map the factored solver can take, solved by both solvers; the relative Frobenius difference of the two
   maps, at the default rank floor and at ``rank_rtol=1e-5``.
9. **Memory by stage** (today's code; the Lite pair of part 1, Linux only): one fit with whole batches
   (``capture_budget=0``, twice) and one with the default capture budget, each in a fresh process, resident
   memory sampled every 10 ms and attributed to ftlab's stages; the task vectors' relative differences.

Usage: ``python benchmarks/bench_transfer.py [--quick] [--parts ...] [--json FILE]`` (``--quick``: small
sizes, the text pair only in parts 1-3, no docs written). Writes the ``transfer`` section of
docs/benchmarks.md and docs/figures/transfer-scaling.png.
"""

from __future__ import annotations

import argparse
import json
import math
import os
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

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = {"statistics": "dense", "solver": "dense"}
EARLIER = "7377140"  # before the fit-cost changes (calibration slowdown fixed, completion rule, one-pass diagnose)


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


# --- side by side: the earlier commit and today's code, each in fresh processes ---------------------------


class Versions:
    """Today's ``src/`` and the earlier commit's, checked out in a temporary git worktree (removed on exit).

    Every measurement of parts 1-3 runs in a fresh process (:func:`versioned_child`) whose ``PYTHONPATH``
    starts with one version's ``src/``; repetitions alternate earlier / today.
    """

    def __init__(self, earlier: str = EARLIER):
        self.earlier = earlier
        self.tmp: Path | None = None

    def __enter__(self) -> dict[str, Path]:
        import tempfile

        self.tmp = Path(tempfile.mkdtemp(prefix="ftlab-bench-earlier-"))
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(self.tmp / "wt"),
                        self.earlier], check=True, capture_output=True)
        return {"earlier": self.tmp / "wt" / "src", "today": ROOT / "src"}

    def __exit__(self, *exc) -> None:
        import shutil

        if self.tmp is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(self.tmp / "wt")],
                           capture_output=True)
            shutil.rmtree(self.tmp, ignore_errors=True)


def versioned_child(src: Path, job: dict) -> dict:
    """Run ``job`` (see :func:`pair_child`) in a fresh process importing ftlab from ``src``; its last stdout line is JSON."""
    import os

    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, __file__, "--pair-child", json.dumps(job)], capture_output=True, text=True,
                         env=env, cwd=str(src.parent))
    if out.returncode:
        raise RuntimeError(f"child {job} with {src} failed:\n{out.stderr[-3000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if not Path(res["ftlab_file"]).resolve().is_relative_to(src.resolve()):
        raise RuntimeError(f"child imported ftlab from {res['ftlab_file']}, not from {src}")
    return res


def alternating(srcs: dict[str, Path], jobs: list[dict], repeat: int) -> list[dict]:
    """``repeat`` rounds; in each, every job runs once per version, the version order alternating between rounds.

    Returns one record per (round, job, version): the child's measurements plus ``round`` and ``version``.
    """
    rows = []
    for r in range(repeat):
        order = ("earlier", "today") if r % 2 == 0 else ("today", "earlier")
        for job in jobs:
            for v in order:
                rows.append({**versioned_child(srcs[v], {**job, "round": r}), "round": r, "version": v,
                             "pair": job["pair"], "mode": job["mode"], "load": os.getloadavg()[0]})
    return rows


def _peak_mb() -> float:
    """This process's peak resident memory (MB), read with whichever version of ftlab is imported."""
    try:
        from ftlab.core.validate import peak_rss_mb as peak
    except ImportError:  # the earlier commit kept it private to the transfer API
        from ftlab.transfer.api import _peak_rss_mb as peak
    return float(peak())


# --- 1./2. the pairs: EfficientNet-Lite0 -> Lite2 and paraphrase-MiniLM-L3-v2 -> all-MiniLM-L6-v2 ----------


class Classifier(nn.Module):
    def __init__(self, enc, classes=10):
        super().__init__()
        self.enc, self.head = enc, nn.Linear(1280, classes)

    def forward(self, x):
        return self.head(self.enc.features(x))


def lite_pair(sizes: dict):
    """``(A, A_ft, B, batches, loss)``: Lite0 with a 10-class head, a full-model task vector (all weights shifted by
    1e-3 noise), Lite2 with its own head; random images."""
    from ftlab.experiments.transfer_accuracy.vision import load_efficientnet

    torch.manual_seed(0)
    A, B = Classifier(load_efficientnet("lite0")).eval(), Classifier(load_efficientnet("lite2")).eval()
    return A, shifted(A, seed=1), B, image_batches(sizes["batches"], sizes["batch"], sizes["image"]), ce_loss


class TextClassifier(nn.Module):
    """A BERT encoder, masked mean pooling (as sentence-transformers), a linear head; batches are dicts."""

    def __init__(self, bert: nn.Module, classes: int, seed: int):
        super().__init__()
        self.bert = bert
        torch.manual_seed(seed)
        self.head = nn.Linear(bert.config.hidden_size, classes)

    def forward(self, batch: dict) -> torch.Tensor:
        h = self.bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        m = batch["attention_mask"].unsqueeze(-1).to(h.dtype)
        return self.head((h * m).sum(1) / m.sum(1).clamp_min(1.0))


def text_loss(model, batch):
    return F.cross_entropy(model(batch), batch["labels"])


def lora_shifted(model: nn.Module, rank: int = 8, scale: float = 2.0, seed: int = 0) -> nn.Module:
    """A copy of a BERT classifier whose query and value weights moved by a rank-``rank`` product
    ``scale * B @ A`` (a LoRA-sized task vector: nothing else changes)."""
    import copy

    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in out.named_parameters():
            if name.endswith(("attention.self.query.weight", "attention.self.value.weight")):
                d_out, d_in = p.shape
                a = torch.randn(rank, d_in, generator=g) / d_in ** 0.5
                b = 0.01 * torch.randn(d_out, rank, generator=g)
                p.add_(scale * b @ a)
    return out


def text_pair(sizes: dict):
    """``(A, A_ft, B, batches, loss)``: paraphrase-MiniLM-L3-v2 -> all-MiniLM-L6-v2 (mean pooling, a head over the
    26 noun supersenses), a LoRA-sized task vector on q and v of A; WordNet noun glosses (``lemma: gloss``)
    tokenized by L6's tokenizer, at most 64 tokens, padded to the longest of each batch."""
    import numpy as np

    from ftlab.data.text import load_minilm_l3, load_minilm_l6, load_wordnet_supersenses

    l3, tok = load_minilm_l3()
    l6, _ = load_minilm_l6()
    wn = load_wordnet_supersenses()
    n = sizes["batches"] * sizes["batch"]
    idx = np.random.default_rng(0).permutation(len(wn.glosses))[:n]
    texts = [f"{wn.lemmas[i]}: {wn.glosses[i]}" for i in idx]
    labels = torch.from_numpy(wn.labels[idx].astype(np.int64))
    k = len(wn.classes)
    A, B = TextClassifier(l3.eval(), k, seed=0).eval(), TextClassifier(l6.eval(), k, seed=1).eval()
    batches = []
    for s in range(0, n, sizes["batch"]):
        enc = tok(texts[s:s + sizes["batch"]], padding="longest", truncation=True, max_length=64, return_tensors="pt")
        batches.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                        "labels": labels[s:s + sizes["batch"]]})
    return A, lora_shifted(A), B, batches, text_loss


PAIRS = {"lite": lite_pair, "text": text_pair}


def _run_mode(mode: str, A, A_ft, B, batches, loss) -> tuple[object, dict]:
    """One API call as ``ftlab transfer`` makes it: ``fit`` (:func:`fit_transfer`, library defaults),
    ``cli_transfer`` / ``cli_diagnose`` (the options this version's CLI passes). Returns (result, extra record)."""
    import inspect

    from ftlab.transfer import TransferOptions, diagnose, fit_transfer

    one_pass = "cka" in inspect.signature(diagnose).parameters  # today: the estimate from the fit's own statistics
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if mode == "fit":
            return fit_transfer(A, A_ft, B, batches, loss, method="bico", options=TransferOptions()), {}
        # the earlier CLI streamed second moments for every map fit (diagnostics=True), in both commands
        opts = TransferOptions() if one_pass else TransferOptions(diagnostics=True)
        if mode == "cli_transfer":
            res = fit_transfer(A, A_ft, B, batches, loss, method="bico", options=opts)
            if one_pass:  # today's CLI reads ftlab's estimate off every map fit
                from ftlab.transfer.diagnose import diagnosis_from_result

                diagnosis_from_result(res)
            return res, {"diagnostics": opts.diagnostics}
        if one_pass:
            return diagnose(A, A_ft, B, batches, loss, method="bico", options=opts, cka=opts.diagnostics), \
                {"diagnostics": False}
        return diagnose(A, A_ft, B, batches, loss, method="bico", options=opts), {"diagnostics": True}


def pair_child(job: dict) -> dict:
    """A fresh process: build the pair, warm up (one no-grad forward of each base), run ``job["mode"]`` timed, read the
    peak memory, then (``fit`` only) time a plain forward + backward of both bases twice (the unit of the ratios)."""
    import ftlab

    torch.set_num_threads(2)
    A, A_ft, B, batches, loss = PAIRS[job["pair"]](job["sizes"])
    with torch.no_grad():
        for m in (A, B):
            loss(m, batches[0])
    t0 = time.perf_counter()
    res, extra = _run_mode(job["mode"], A, A_ft, B, batches, loss)
    wall = time.perf_counter() - t0
    out = {"ftlab_file": ftlab.__file__, "wall_s": wall, "peak_mb": _peak_mb(), **extra}
    if job["mode"] == "fit":
        out.update(res.timings)
        out["plain_s"] = min(plain((A, B), batches, loss) for _ in range(2))
        out["rows"] = sum(int(b["attention_mask"].sum()) if isinstance(b, dict) else int(b[0].shape[0])
                          for b in batches)
        if job.get("save"):
            torch.save({k: v.detach().double() for k, v in res.task_vector.items()}, job["save"])
    return out


def _median(xs) -> float:
    import statistics

    return float(statistics.median(xs))


def pair_part(srcs: dict[str, Path], pair: str, sizes: dict, repeat: int, tmp: Path) -> dict:
    """Parts 1 and 2: ``fit`` children of both versions, alternating; the two task vectors of the last round compared."""
    jobs = [{"pair": pair, "mode": "fit", "sizes": sizes}]
    load0 = os.getloadavg()
    rows = []
    for r in range(repeat):
        order = ("earlier", "today") if r % 2 == 0 else ("today", "earlier")
        for v in order:
            save = str(tmp / f"{pair}-{v}.pt") if r == repeat - 1 else None
            rows.append({**versioned_child(srcs[v], {**jobs[0], "round": r, "save": save}), "round": r, "version": v,
                         "load": os.getloadavg()[0]})
    tv = {v: torch.load(tmp / f"{pair}-{v}.pt") for v in ("earlier", "today")}
    diff = sum(float((tv["today"][k] - tv["earlier"][k]).pow(2).sum()) for k in tv["today"]) ** 0.5
    ref = sum(float(x.pow(2).sum()) for x in tv["earlier"].values()) ** 0.5
    return {"rows": rows, "sizes": sizes, "load": [load0, os.getloadavg()], "agreement": diff / ref,
            "same_keys": sorted(tv["today"]) == sorted(tv["earlier"])}


def diagnose_part(srcs: dict[str, Path], pairs: dict[str, dict], repeat: int) -> dict:
    """Part 3: ``transfer --diagnose`` against the transfer, with the API calls each version's CLI makes."""
    load0 = os.getloadavg()
    jobs = [{"pair": p, "mode": m, "sizes": sz} for p, sz in pairs.items() for m in ("cli_transfer", "cli_diagnose")]
    rows = alternating(srcs, jobs, repeat)
    return {"rows": rows, "load": [load0, os.getloadavg()]}


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
            "peak_rss_mb": _peak_mb()}


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


def solver_agreement(sizes: dict, rtols=(None, 1e-5)) -> dict:
    """Part 8: ``{"maps": [...], "rtols": [...], "diff": {rtol: [relative difference per map]}}`` -- the factored and
    the dense solve of each distinct map of the Lite pair that the factored solver can take (rows kept, the chain
    closed by the pad/truncate map, both widths >= 256), at each rank floor."""
    from ftlab.transfer import get_method
    from ftlab.transfer.align import _choose_factored, fit_map
    from ftlab.transfer.factored import FACTORED_MIN_WIDTH, as_dense

    torch.set_num_threads(1)
    A, _, B, batches, _ = lite_pair(sizes)
    problem = vit_problem(A, B)
    stats, _ = calibrate(problem, A, B, batches, False)
    m = get_method("bico")
    seen: dict = {}
    for tp in problem.pairs:
        for _, st, chain, label, name in m.solves(tp, problem.target_spec.points[tp], stats):
            da, db = st.a.dim, st.b.dim  # the factored solver can take it: rows kept, chain closed by pad/truncate
            if min(da, db) >= FACTORED_MIN_WIDTH and _choose_factored(st, chain, "factored", 0.0, da, db):
                seen.setdefault((id(st), tuple((lab, id(c)) for lab, c in chain), label), (st, chain, label, name))
    out: dict = {"maps": [v[3] for v in seen.values()], "rtols": [str(r) for r in rtols], "diff": {}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for r in rtols:
            diffs = []
            for st, chain, label, _ in seen.values():
                fd = fit_map(st, source=label, completion=chain, solver="dense", rank_rtol=r)
                ff = fit_map(st, source=label, completion=chain, solver="factored", rank_rtol=r)
                diffs.append(float(torch.linalg.norm(as_dense(ff.R) - fd.R) / torch.linalg.norm(fd.R)))
            out["diff"][str(r)] = diffs
    return out


def agreement_md(ag: dict) -> list[str]:
    lines = ["", "### Solver agreement on real statistics (EfficientNet-Lite0 -> Lite2, today's code)", "",
             f"The {len(ag['maps'])} distinct maps of part 1 that the factored solver can take, each solved by both "
             "solvers: how many of the two maps agree to 1e-9 relative (Frobenius), and the largest difference.", "",
             "| rank floor | maps within 1e-9 | within 1e-6 | largest difference |", "|---|---|---|---|"]
    for r in ag["rtols"]:
        d = ag["diff"][r]
        name = "default (`rank_rtol=None`: sqrt(eps_64) relative, or the precision of the sums)" if r == "None" \
            else f"`rank_rtol={r}`"
        lines.append(f"| {name} | {sum(x <= 1e-9 for x in d)} of {len(d)} | {sum(x <= 1e-6 for x in d)} of {len(d)} | "
                     f"{max(d):.1e} |")
    return lines


# --- 9. memory by stage: where the Lite fit's peak is ------------------------------------------------------


def _rss_mb() -> float:
    """This process's resident memory now (MB; Linux ``/proc``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS line in /proc/self/status")


class _StageLines:
    """A stand-in for stderr that keeps ftlab's stage lines (``ftlab: NAME: started`` / ``done in``) with the time."""

    def __init__(self):
        self.marks: list[tuple[float, str]] = []

    def write(self, text: str) -> int:
        for line in text.splitlines():
            if line.startswith("ftlab: "):
                self.marks.append((time.perf_counter(), line[len("ftlab: "):]))
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def stages_child(job: dict) -> dict:
    """A fresh process: one Lite fit with today's code at ``job["budget"]`` (None: the default capture budget), its
    resident memory sampled every 10 ms and ftlab's stage lines timed; the peak of each stage, and the task vector
    saved to ``job["save"]``."""
    import re
    import threading

    from ftlab.core.progress import set_stage_lines
    from ftlab.transfer import TransferOptions, fit_transfer

    torch.set_num_threads(2)
    A, A_ft, B, batches, loss = lite_pair(job["sizes"])
    with torch.no_grad():
        for m in (A, B):
            loss(m, batches[0])
    samples: list[tuple[float, float]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append((time.perf_counter(), _rss_mb()))
            done.wait(0.01)

    lines, err = _StageLines(), sys.stderr
    opts = TransferOptions() if job["budget"] is None else TransferOptions(capture_budget=job["budget"])
    base = _rss_mb()
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    sys.stderr = lines  # type: ignore[assignment]
    set_stage_lines(True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = fit_transfer(A, A_ft, B, batches, loss, method="bico", options=opts)
    finally:
        set_stage_lines(False)
        sys.stderr = err
        done.set()
        thread.join()
    torch.save({k: v.detach().double() for k, v in res.task_vector.items()}, job["save"])
    started: dict[str, float] = {}
    peaks: dict[str, float] = {}
    for t, text in lines.marks:
        m = re.match(r"(.+?)(?: \(\d+ items\))?: (started|done in .*)$", text)
        if not m:
            continue
        name = m.group(1)
        if m.group(2) == "started":
            started[name] = t
        elif name in started:
            inside = [r for ts, r in samples if started[name] <= ts <= t]
            peaks[name] = max(inside) if inside else math.nan
    return {"budget": job["budget"], "base_mb": base, "peaks": peaks, "peak_mb": max(r for _, r in samples),
            "calibration_s": res.timings.get("calibration_s")}


def stages_part(sizes: dict, tmp: Path) -> dict:
    """Part 9: the Lite fit with whole batches (``capture_budget=0``, twice) and with the default budget, each in a
    fresh process: the peak of each stage, and how far the task vectors lie apart (two whole-batch runs: run-to-run;
    whole against pieces: what the pieces change)."""
    runs = []
    for i, budget in enumerate((0.0, None, 0.0)):
        job = {"sizes": sizes, "budget": budget, "save": str(tmp / f"stages-{i}.pt")}
        runs.append(child(["--stages-child", json.dumps(job)]))
    tv = [torch.load(tmp / f"stages-{i}.pt") for i in range(3)]

    def rel(a: dict, b: dict) -> float:
        num = sum(float((a[k] - b[k]).pow(2).sum()) for k in a)
        return (num / sum(float(x.pow(2).sum()) for x in a.values())) ** 0.5

    return {"runs": runs, "sizes": sizes, "whole_vs_whole": rel(tv[0], tv[2]), "whole_vs_pieces": rel(tv[0], tv[1])}


def stages_md(st: dict) -> list[str]:
    names = list(dict.fromkeys(n for r in st["runs"] for n in r["peaks"]))
    head = "| stage | " + " | ".join(("whole batches (`capture_budget=0`)", "default budget (256 MB)",
                                       "whole batches, again")) + " |"
    lines = ["", "### Memory by stage (EfficientNet-Lite0 -> Lite2, today's code)", "",
             "One fit per column, each in a fresh process, resident memory sampled every 10 ms and attributed to "
             "ftlab's stages by their start and end lines: the largest resident memory inside each stage. "
             f"Before the fit: {st['runs'][0]['base_mb']:.0f} MB (Python, torch, both models, the batches).", "",
             head, "|---|---|---|---|"]
    for n in names:
        lines.append(f"| {n} | " + " | ".join(f"{r['peaks'].get(n, math.nan):.0f} MB" for r in st["runs"]) + " |")
    lines.append("| whole fit (largest sample) | " + " | ".join(f"**{r['peak_mb']:.0f} MB**" for r in st["runs"]) + " |")
    lines.append("| calibration time | " + " | ".join(f"{r['calibration_s']:.2f} s" for r in st["runs"]) + " |")
    lines += ["", f"Task vectors: two whole-batch runs differ by {st['whole_vs_whole']:.1e} relative (Frobenius); "
              f"whole batches and pieces by {st['whole_vs_pieces']:.1e} (float32 passes on pieces of another size "
              "round differently, and maps with directions near their rank floor amplify that)."]
    return lines


# --- the report -----------------------------------------------------------------------------------------


def _x(a: float, b: float) -> str:
    return f"{a / b:.2f}x"


def _by(rows: list[dict], **where) -> list[dict]:
    return [r for r in rows if all(r.get(k) == v for k, v in where.items())]


def _pair_ratio(rows: list[dict], key: str, num: dict, den: dict) -> float:
    """Median over rounds of ``num-row[key] / den-row[key]`` within each round (the side-by-side ratio)."""
    return _median([_by(rows, round=r, **num)[0][key] / _by(rows, round=r, **den)[0][key]
                    for r in sorted({x["round"] for x in rows})])


def _goal(value: float, limit: float) -> str:
    return "**met**" if value <= limit else "**not met**"


def _loads(avg) -> str:
    return "?" if not avg else ", ".join(f"{x:.1f}" for x in avg)


def _load(part: dict) -> str:
    (a, _, _), (b, _, _) = part["load"]
    return f"load average (1 min) {a:.1f} at the start, {b:.1f} at the end"


def pair_md(part: dict, title: str, unit: str, goals: dict, labels: dict) -> list[str]:
    """Table of one pair: medians per version, ratios to the plain forward + backward, today / earlier, goals."""
    rows = part["rows"]
    ev, tv = _by(rows, version="earlier"), _by(rows, version="today")
    e, t = {"version": "earlier"}, {"version": "today"}
    stages = [("calibration", "calibration_s"), ("solves", "fit_s"), ("transport", "apply_s"), ("**whole fit**", "wall_s")]
    out = ["", f"### {title}", "",
           f"| stage | earlier (`{EARLIER}`) | today (`{labels['today']}`) | today / earlier | goal (today) |",
           "|---|---|---|---|---|",
           f"| plain forward + backward of {unit} | {_median([r['plain_s'] for r in ev]):.2f} s | "
           f"{_median([r['plain_s'] for r in tv]):.2f} s | {_pair_ratio(rows, 'plain_s', t, e):.2f} | |"]
    for name, key in stages:
        xe, xt = (_median([r[key] / r["plain_s"] for r in v]) for v in (ev, tv))
        goal = f"<= {goals[key]:g}x: {_goal(xt, goals[key])}" if key in goals else ""
        out.append(f"| {name} | {_median([r[key] for r in ev]):.2f} s ({xe:.2f}x) | {_median([r[key] for r in tv]):.2f} s "
                   f"(**{xt:.2f}x**) | {_pair_ratio(rows, key, t, e):.2f} | {goal} |")
    pe, pt = max(r["peak_mb"] for r in ev), max(r["peak_mb"] for r in tv)
    goal = f"<= {goals['peak_mb']:.0f} MB: {_goal(pt, goals['peak_mb'])}" if "peak_mb" in goals else ""
    out.append(f"| peak memory (fresh process, largest) | {pe:.0f} MB | **{pt:.0f} MB** | "
               f"{_pair_ratio(rows, 'peak_mb', t, e):.2f} | {goal} |")
    each = "; ".join(f"{v} " + ", ".join(f"{r['wall_s']:.2f}" for r in _by(rows, version=v)) for v in ("earlier", "today"))
    out += ["", f"Each repetition's whole fit (s, in run order per version): {each}. Times in parentheses are "
            f"ratios to the plain forward + backward of the same process (median over repetitions); the whole fit is "
            f"the wall time of the `fit_transfer` call (today's includes its repair step, "
            f"{_median([r.get('repair_s', 0.0) for r in tv]):.2f} s); "
            f"today / earlier is the median of the per-round ratios. Calibration data: {part['rows'][0]['rows']} "
            f"{'images' if 'image' in part['sizes'] else 'real tokens'}; "
            f"{_load(part)}. The two versions' task vectors differ by {part['agreement']:.1e} (relative)."]
    return out


def diagnose_md(part: dict) -> list[str]:
    rows = part["rows"]
    out = ["", "### `ftlab transfer --diagnose` against the transfer", "",
           "The API calls each version's `ftlab transfer` makes, each in a fresh process (2 threads): the earlier CLI "
           "streamed second moments for every map fit (`diagnostics=True`) in both commands; today's transfer fits "
           "without them and reads ftlab's estimate off the fit, and `--diagnose` is one pass over the fit's own "
           "statistics (`cka=False`). Medians over repetitions; diagnose / transfer is the median of the per-round "
           "ratios.", "",
           "| pair | version | transfer | diagnose | diagnose / transfer | peak: transfer | peak: diagnose | "
           "goal: diagnose <= transfer |", "|---|---|---|---|---|---|---|---|"]
    for pair in dict.fromkeys(r["pair"] for r in rows):
        for v in ("earlier", "today"):
            tr, dg = _by(rows, pair=pair, version=v, mode="cli_transfer"), _by(rows, pair=pair, version=v,
                                                                             mode="cli_diagnose")
            ratio = _pair_ratio(rows, "wall_s", {"pair": pair, "version": v, "mode": "cli_diagnose"},
                                {"pair": pair, "version": v, "mode": "cli_transfer"})
            goal = _goal(ratio, 1.0) if v == "today" else ""
            out.append(f"| {PAIR_NAMES[pair]} | {v} | {_median([r['wall_s'] for r in tr]):.2f} s | "
                       f"{_median([r['wall_s'] for r in dg]):.2f} s | {ratio:.2f} | {max(r['peak_mb'] for r in tr):.0f} MB"
                       f" | {max(r['peak_mb'] for r in dg):.0f} MB | {goal} |")
        d = _pair_ratio(rows, "wall_s", {"pair": pair, "version": "today", "mode": "cli_diagnose"},
                        {"pair": pair, "version": "earlier", "mode": "cli_diagnose"})
        out.append(f"| {PAIR_NAMES[pair]} | today / earlier, diagnose | | {d:.2f} | | | | |")
    out += ["", f"{_load(part)}."]
    return out


PAIR_NAMES = {"lite": "EfficientNet-Lite0 -> Lite2", "text": "MiniLM-L3 -> L6"}


def markdown(raw: dict, quick: bool) -> str:
    lite, text, diag, vit, sc, gpu = (raw.get(k) for k in ("lite", "text", "diagnose", "vit", "scaling", "gpu"))
    labels = {"today": raw.get("today", "HEAD")}
    parts = ["## Task-vector transfer (BiCo): the fit against the forward-backward it rests on", "",
             f"Parts 1-3 measure the earlier code (commit `{EARLIER}`, checked out in a temporary git worktree) and "
             f"today's (`{labels['today']}`) side by side in one run: every measurement in a fresh process importing "
             "one version's `src/`, repetitions alternating earlier / today. The load averages below say how busy the "
             "machine was (the run's own processes use 2 threads, so about 2 is the run itself on an otherwise quiet "
             "machine): ratios measured side by side are the robust figures, absolute seconds are not. Ratios are to a "
             "plain forward + backward of both bases over the same batches."]
    if lite is not None:
        sz = lite["sizes"]
        parts += pair_md(lite, f"EfficientNet-Lite0 -> Lite2 (ImageNet weights), {sz['batches'] * sz['batch']} images "
                         f"of {sz['image']} px in batches of {sz['batch']}, 2 threads", "both bases",
                         {"calibration_s": 2.0, "wall_s": 4.0, "peak_mb": 1000.0}, labels)
    if text is not None:
        sz = text["sizes"]
        parts += pair_md(text, f"paraphrase-MiniLM-L3-v2 -> all-MiniLM-L6-v2, {sz['batches'] * sz['batch']} WordNet "
                         f"glosses (at most 64 tokens) in batches of {sz['batch']}, a rank-8 task vector on q and v, "
                         "2 threads", "both bases", {"wall_s": 3.0}, labels)
    if diag is not None:
        parts += diagnose_md(diag)
    if vit is not None:
        p = vit["plain"]
        parts += ["", f"### ViT-B/16-sized random models, {vit['rows']} token rows, 1 thread (today's code)", "",
                  "Default = today's path; reference = the dense path kept runnable (`statistics=\"dense\"`, "
                  "`solver=\"dense\"`), its solves timed once per distinct map and multiplied by its count.", "",
                  "| measurement | reference | default | goal |", "|---|---|---|---|",
                  f"| plain forward + backward, both models | {p:.2f} s | | |",
                  f"| calibration | {vit['cal_ref']:.2f} s ({_x(vit['cal_ref'], p)}) | {vit['cal_new']:.2f} s "
                  f"(**{_x(vit['cal_new'], p)}**) | <= 1.6x: {_goal(vit['cal_new'] / p, 1.6)} |",
                  f"| all solves ({vit['maps']} maps; {vit['factored']} kept as low-rank maps) | "
                  f"{vit.get('solve_ref', math.nan):.1f} s (per distinct map, times its count) | {vit['solve_new']:.1f} s "
                  f"(**{100 * vit['solve_new'] / vit.get('solve_ref', math.nan):.1f}%** of the reference) | <= 25 s: "
                  f"{_goal(vit['solve_new'], 25.0)} |"]
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
                  f"{gpu['maps']} maps kept as low-rank maps); statistics and solves stay on the device."]
    if raw.get("agreement"):
        parts += agreement_md(raw["agreement"])
    if raw.get("stages"):
        parts += stages_md(raw["stages"])
    errors, wall = raw.get("errors", []), raw.get("wall", math.nan)
    rows_e = "\n".join(f"| {name} | {e:.1e} | {s:.1e} |" for name, e, s in errors)
    parts += ["", "### Accuracy", "", "Relative error of the transferred task vector on an exact unit-permuted copy of a "
              "float32 OpenCLIP-style ViT (width 64, 4 layers, MLP 256, bare `x @ proj`), 256 calibration images, and of a "
              "self-transfer:", "", "| path | permuted copy | self-transfer |", "|---|---|---|", rows_e, "",
              f"Whole benchmark: {wall:.0f} s wall{' (quick sizes)' if quick else ''}; load average (1, 5, 15 min) "
              f"{_loads(raw.get('load_start'))} at its start, {_loads(raw.get('load_end'))} at its end."]
    if len(raw.get("runs", [])) > 1:  # merged from several runs: say which part each gave
        parts[-1] = "Merged from several runs (a part measured later replaces an earlier one): " + "; ".join(
            f"{', '.join(r['parts'])} at `{r['today']}`, {r['wall']:.0f} s wall, load average {_loads(r['load_start'])} "
            f"at its start and {_loads(r['load_end'])} at its end" for r in raw["runs"] if r["parts"]) + "."
    return "\n".join(parts)


def merged(files: list[str]) -> dict:
    """The measurements of several runs (``--json`` files) in one: a part measured later replaces an earlier one."""
    raw: dict = {"runs": []}
    for f in files:
        one = json.loads(Path(f).read_text())
        raw["runs"].append({"parts": sorted(k for k in one if k in PART_KEYS and one[k]), "today": one.get("today"),
                            "wall": one.get("wall"), "load_start": one.get("load_start"),
                            "load_end": one.get("load_end")})
        for k, v in one.items():
            if v:
                raw[k] = v
    return raw


#: The keys of a run's measurements (the rest describe the run).
PART_KEYS = ("lite", "text", "diagnose", "vit", "scaling", "gpu", "errors", "agreement", "stages")


def write_docs(raw: dict) -> str:
    md = markdown(raw, False)
    if raw.get("scaling"):
        scaling_figure(raw["scaling"], ROOT / "docs" / "figures" / "transfer-scaling.png")
    from _common import replace_block

    body = f"{md.strip()}\n\n*Measured {raw.get('date', time.strftime('%Y-%m-%d'))} on: {raw.get('machine', '?')}.*"
    replace_block(ROOT / "docs" / "benchmarks.md", "<!-- BEGIN transfer -->", "<!-- END transfer -->", body)
    return md


def _today() -> str:
    """Today's commit (short hash), ``+`` when the working tree differs from it."""
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no", "src"],
                           capture_output=True, text=True)
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def side_by_side(parts: set[str], quick: bool, repeat: int, raw: dict, save) -> None:
    """Parts 1-3 (lite, text, diagnose), both versions in one temporary worktree."""
    import tempfile

    # --quick: the text pair only, small (the earlier code's Lite solves take minutes at any size)
    sizes = {"lite": {"batches": 4, "batch": 25, "image": 64}, "text": {"batches": 4, "batch": 25}} if not quick else \
        {"text": {"batches": 2, "batch": 4}}
    if not parts & {"lite", "text", "diagnose"}:
        return
    with Versions() as srcs, tempfile.TemporaryDirectory() as tmp:
        available = {}
        for pair in sizes:
            try:
                PAIRS[pair]({**sizes[pair], "batches": 1})
                available[pair] = sizes[pair]
            except Exception as exc:  # noqa: BLE001 - weights or data not installed: the part is skipped and says why
                print(f"{PAIR_NAMES[pair]} skipped: {exc}")
        for pair in available:
            if pair in parts:
                raw[pair] = pair_part(srcs, pair, available[pair], repeat, Path(tmp))
                save()
        if "diagnose" in parts and available:
            raw["diagnose"] = diagnose_part(srcs, available, repeat)
            save()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run); docs are not written")
    ap.add_argument("--parts", default="lite,text,diagnose,vit,scaling,gpu,accuracy,agreement,stages",
                    help="comma-separated parts to run")
    ap.add_argument("--repeat", type=int, default=None,
                    help="rounds of the side-by-side parts (each version once per round; default 2, 1 with --quick)")
    ap.add_argument("--pair-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--scaling-child", nargs=3, type=int, help=argparse.SUPPRESS)
    ap.add_argument("--stages-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None, help="also write the raw measurements to this file")
    ap.add_argument("--docs-from", nargs="+", default=None, metavar="JSON",
                    help="write docs/benchmarks.md and the figure from the raw measurements of earlier runs (merged)")
    args = ap.parse_args()
    if args.pair_child:
        print(json.dumps(pair_child(json.loads(args.pair_child))))
        return
    if args.scaling_child:
        print(json.dumps(scaling_child(*args.scaling_child)))
        return
    if args.stages_child:
        print(json.dumps(stages_child(json.loads(args.stages_child))))
        return
    if args.docs_from:
        print(write_docs(merged(args.docs_from)))
        return
    parts = set(args.parts.split(","))
    repeat = args.repeat if args.repeat is not None else (1 if args.quick else 2)
    t0 = time.perf_counter()
    size = {"width": 768, "depth": 12, "heads": 12, "mlp": 3072} if not args.quick else \
        {"width": 128, "depth": 2, "heads": 2, "mlp": 512}
    raw: dict = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "today": _today(),
                 "load_start": os.getloadavg()}

    def save() -> None:  # after every part, so that a run stopped early keeps what it measured
        raw["wall"] = time.perf_counter() - t0
        raw["load_end"] = os.getloadavg()
        if args.json:
            Path(args.json).write_text(json.dumps(raw, indent=1, default=str))

    side_by_side(parts, args.quick, repeat, raw, save)
    for part in args.parts.split(","):
        if part == "gpu" and torch.cuda.is_available():
            raw["gpu"] = {**vit_part(64, 8, 2, size, device="cuda"), "device": torch.cuda.get_device_name()}
        elif part == "vit":
            raw["vit"] = vit_part(64, 8, 2, size)
        elif part == "scaling":
            widths, rows = ((256, 512, 1024, 2048), (64, 128, 256, 512, 1024)) if not args.quick else \
                ((128, 256), (64, 128))
            raw["scaling"] = scaling_part(widths, rows, 1024 if not args.quick else 256, threads=2)
        elif part == "accuracy":
            raw["errors"] = permuted_copy_errors()
        elif part == "agreement" and not args.quick:
            raw["agreement"] = solver_agreement({"batches": 4, "batch": 25, "image": 64})
        elif part == "stages" and not args.quick and sys.platform.startswith("linux"):
            import tempfile

            with tempfile.TemporaryDirectory() as tmp:
                raw["stages"] = stages_part({"batches": 4, "batch": 25, "image": 64}, Path(tmp))
        else:
            continue
        save()
    save()
    if not args.quick and parts >= {"lite", "text", "diagnose", "vit", "scaling", "accuracy"}:
        print(write_docs(raw))
    else:
        print(markdown(raw, args.quick))


if __name__ == "__main__":
    main()
