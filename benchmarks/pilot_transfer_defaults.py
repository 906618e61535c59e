"""The validation pilot that chose ftlab's transfer defaults (centring, copy rule, statistics repair).

    python benchmarks/pilot_transfer_defaults.py lite0->lite1 0      # one design pair and seed; appends to the CSV

For one design pair and seed (the benchmark's design task: MNIST at 64 px for the EfficientNet-Lite pairs, WordNet
noun glosses for MiniLM-L3 -> L6), the bases are probed and fine-tuned as in the benchmark
(:func:`ftlab.experiments.transfer_accuracy.run.prepare`), BiCo is fitted once uncentred and once centred (100
calibration samples), and every copy rule (``sum``, ``split``, ``first``) and statistics repair (``none``, ``mean``,
``mean_std``; only ``none`` where the target keeps no running statistics) is scored on the *validation* split at
alpha = 1 and at the best alpha of the grid 0, 0.5, ..., 3 (ties: the smallest). Rows are appended to
docs/transfer-defaults-pilot.csv; docs/transfer-benchmark.md ("Choosing ftlab's defaults") reads them. No test data
is used.
"""

from __future__ import annotations

import argparse
import csv
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "transfer-defaults-pilot.csv"
GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0)
FIELDS = ["pair", "seed", "center", "copies", "repair", "val_alpha1", "val_searched", "alpha"]


def pilot_rows(pair: str, seed: int) -> list[dict]:
    import torch

    from ftlab.experiments.transfer_accuracy.compare import Scorer, calibration_batches
    from ftlab.experiments.transfer_accuracy.finetune import task_loss
    from ftlab.experiments.transfer_accuracy.pairs import PAIRS
    from ftlab.experiments.transfer_accuracy.run import full_config, prepare
    from ftlab.transfer import TransferOptions, fit_transfer, get_method, search_alpha
    from ftlab.transfer.repair import fit_repair

    torch.set_num_threads(1)
    kind = PAIRS[pair].kind
    cfg = full_config()
    task = cfg.image_tasks[0] if kind == "vision" else cfg.text_tasks[0]
    p = prepare(kind, pair, task, seed, cfg.to_dict())
    score = Scorer(p.splits)
    batches = calibration_batches(*p.splits["train"], kind="n100", seed=seed)
    base_val = score(p.target_base, "val")
    repairs = {m: fit_repair(p.target_base, batches, mode=m) for m in ("mean", "mean_std")}
    opts = TransferOptions(copies="sum", repair="none",
                           **({"padding_mask": lambda batch: batch[0]["attention_mask"]} if kind == "text" else {}))
    rows = []
    for center in (False, True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = fit_transfer(p.source_base, p.source_ft, p.target_base, batches, task_loss(p.classes),
                               method=get_method("bico", center=center), options=opts)
        for copies in ("sum", "split", "first"):
            tau = res.with_copies(copies)
            for mode in ("none", "mean", "mean_std"):
                rep = repairs[mode] if mode != "none" else None
                if mode != "none" and rep is None:
                    continue

                def val(a: float, tau=tau, rep=rep) -> float:
                    if a == 0.0:
                        return base_val
                    m = tau.apply(p.target_base, a)
                    if rep is not None:
                        rep.apply_(m)
                    return score(m, "val")

                best, table = search_alpha(val, grid=GRID)
                v = table.set_index("alpha")["score"]
                rows.append({"pair": pair, "seed": seed, "center": center, "copies": copies, "repair": mode,
                             "val_alpha1": v[1.0], "val_searched": v[best], "alpha": best})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pair")
    ap.add_argument("seed", type=int)
    args = ap.parse_args()
    rows = pilot_rows(args.pair, args.seed)
    new = not OUT.exists()
    with OUT.open("a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        if new:
            w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
