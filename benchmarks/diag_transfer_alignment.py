"""Diagnostic for the transfer benchmark: how alignable are the bases, and how close does each method
get to the target's own task vector?

    python benchmarks/diag_transfer_alignment.py                 # 3 settings x 2 tasks x 2 seeds
    python benchmarks/diag_transfer_alignment.py --no-write      # print only

For each setting of the benchmark family, task and seed (the ``--full`` protocol: 1000 training
images, 100 calibration samples), it fine-tunes source A and target B with the benchmark's recipe and
transfers A's task vector with every method. It reports, per setting (median over B's capture points
and over runs):

* ``cka in`` / ``cka out``: linear CKA between A's and B's input activations / output gradients at
  paired layers (1 = the spaces are an orthogonal re-coding of each other up to scale, the case in which
  BiCo is exact; ftlab's planted tests reach residual 1e-6 there);
* ``resid in`` / ``resid out``: ``||A R - B||_F / ||B||_F`` of BiCo's fitted maps (0 = exact);
* ``cos(tau, tau_B)``: cosine between the transferred task vector and the task vector of B
  fine-tuned directly on the same images (the benchmark's upper bound), over all parameters.

Writes the table into docs/transfer-benchmark.md between ``<!-- BEGIN alignment -->`` markers.
It is a measurement of the bases, not a speed benchmark; it takes a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import numpy as np

from _common import replace_block

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- BEGIN alignment -->", "<!-- END alignment -->"


def cosine(u, v) -> float:
    """Cosine between two task vectors with the same names and shapes (float64)."""
    dot = sum(float((u[k].double() * v[k].double()).sum()) for k in u)
    return dot / max(u.norm() * v.norm(), 1e-300)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="digits,fashion_tops_rot180")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    import torch

    from ftlab.experiments.transfer_accuracy.family import SETTINGS, load_base
    from ftlab.experiments.transfer_accuracy.finetune import batches_of, finetune, task_loss
    from ftlab.experiments.transfer_accuracy.run import full_config
    from ftlab.experiments.transfer_accuracy.tasks import TASKS, load_task
    from ftlab.transfer import TaskVector, TransferOptions, fit_transfer
    from ftlab.transfer.align import RankWarning

    torch.set_num_threads(2)
    cfg = full_config()
    methods = ("bico", "activation_only", "gradient_only", "naive")
    rows = []
    t0 = time.perf_counter()
    for task in args.tasks.split(","):
        classes = TASKS[task].joint_classes
        loss = task_loss(classes)
        for seed in (int(s) for s in args.seeds.split(",")):
            d = load_task(task, n_train=cfg.n_train, n_val=cfg.n_val, n_test=cfg.n_test, seed=seed)
            x, y = torch.from_numpy(d.x_train), torch.from_numpy(d.y_train)
            tuned: dict = {}
            for setting, (src, tgt) in SETTINGS.items():
                for name in (src, tgt):
                    if name not in tuned:
                        b = load_base(name)[0]
                        tuned[name] = (b, finetune(b, x, y, classes, config=cfg.vision_finetune, seed=seed))
                (a, a_ft), (b, b_ft) = tuned[src], tuned[tgt]
                tau_direct = TaskVector.from_models(b, b_ft)
                batches = batches_of(x, y, batch_size=cfg.cal_batch_size, n=cfg.n_cal, seed=seed)
                row = {"setting": setting, "task": task, "seed": seed}
                for method in methods:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", RankWarning)
                        res = fit_transfer(a, a_ft, b, batches, loss, method=method,
                                           options=TransferOptions(diagnostics=method == "bico"))
                    row[f"cos_{method}"] = cosine(res.task_vector, tau_direct)
                    if method == "bico":
                        layers = res.layers()
                        for key in ("in_cka", "out_cka", "in_residual_fit", "out_residual_fit"):
                            vals = [r[key] for r in layers if key in r and np.isfinite(r[key])]
                            row[key] = float(np.median(vals)) if vals else float("nan")
                rows.append(row)
                print(row, flush=True)
    wall = time.perf_counter() - t0

    import pandas as pd

    df = pd.DataFrame(rows)
    med = df.groupby("setting").median(numeric_only=True).reindex(list(SETTINGS))
    lines = ["| setting | cka in | cka out | resid in | resid out | cos bico | cos activation_only | "
             "cos gradient_only | cos naive |", "|---|---|---|---|---|---|---|---|---|"]
    for s, r in med.iterrows():
        lines.append(f"| {s} | {r.in_cka:.2f} | {r.out_cka:.2f} | {r.in_residual_fit:.2f} | {r.out_residual_fit:.2f} | "
                     f"{r.cos_bico:.3f} | {r.cos_activation_only:.3f} | {r.cos_gradient_only:.3f} | {r.cos_naive:.3f} |")
    table = "\n".join(lines)
    print(table)
    print(f"{len(rows)} runs in {wall:.0f} s")
    if args.no_write:
        return
    replace_block(ROOT / "docs" / "transfer-benchmark.md", BEGIN, END,
                  f"*Generated by `benchmarks/diag_transfer_alignment.py` ({time.strftime('%Y-%m-%d')}; tasks "
                  f"{args.tasks.replace(',', ', ')}; seeds {args.seeds}; medians over BiCo's layers and over runs).*"
                  f"\n\n{table}")


if __name__ == "__main__":
    main()
