"""Benchmark: the quick ``deep`` reproduction's wall time, and side-by-side costs behind it.

* ``--report DIR``: read the wall time of a finished ``ftlab reproduce deep --out DIR`` run from
  ``DIR/sections/deep.md`` and its number of pretraining / fine-tuning runs from the tables (the
  target: quick run < 15 min on 2 cores). The reproduction itself is not rerun here.
* Side by side in one process, one thread: a ResNet-18 (width 8, batch 64, 28x28) training step in
  float32 vs bfloat16 autocast (bf16 is optional in ftlab, never required), and per-layer geometry
  of 256 x 6272 activations computed one-shot (Gram space) vs streamed in float64 feature space
  (:class:`ftlab.core.geometry.GeometryAccumulator`, 4 batches) on a 784-feature layer.

Run: ``.venv/bin/python benchmarks/bench_deep.py --report /tmp/rep_deep`` (about a minute).
Results go to docs/benchmarks.md (section ``deep``).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import timeit, write_section  # noqa: E402
from ftlab.core.geometry import GeometryAccumulator, ensd, linear_cka, participation_ratio  # noqa: E402
from ftlab.models.resnet import resnet18  # noqa: E402


def train_step_times(width: int = 8, batch: int = 64) -> dict:
    torch.manual_seed(0)
    X, y = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
    out = {}
    for name, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        model = resnet18(width=width, in_channels=1, seed=0)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def step(model=model, opt=opt, dtype=dtype):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                loss = torch.nn.functional.cross_entropy(model(X), y)
            loss.backward()
            opt.step()

        step()
        out[name] = timeit(step, repeat=5)
    return out


def geometry_times() -> dict:
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((256, 6272)), rng.standard_normal((256, 6272))
    one = timeit(lambda: (participation_ratio(A), ensd(A, B), linear_cka(A, B)), repeat=3)
    a, b = rng.standard_normal((1024, 784)), rng.standard_normal((1024, 784))

    def streamed():
        acc = GeometryAccumulator()
        for i in range(0, 1024, 256):
            acc.update(a[i:i + 256], b[i:i + 256])
        return acc.participation_ratio(), acc.ensd(), acc.linear_cka()

    return {"one_shot_6272": one, "streamed_784": timeit(streamed, repeat=3),
            "one_shot_784": timeit(lambda: (participation_ratio(a), ensd(a, b), linear_cka(a, b)), repeat=3)}


def report_wall(folder: Path) -> tuple[str, str]:
    text = (folder / "sections" / "deep.md").read_text()
    m = re.search(r"section deep: (\w+) run, (\d+) s", text)
    if not m:
        raise SystemExit(f"{folder}/sections/deep.md has no wall-time marker")
    import pandas as pd

    d = folder / "deep"
    counts = ", ".join(f"{len(pd.read_csv(d / f))} {f[:-4].replace('_', ' ')} runs"
                       for f in ("resnet_pt.csv", "resnet_ft.csv", "modular_pt.csv", "modular_ft.csv") if (d / f).exists())
    return f"{m.group(1)} run: **{int(m.group(2))} s** ({int(m.group(2)) / 60:.1f} min; target < 15 min)", counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report", type=Path, default=None, help="folder of a finished `ftlab reproduce deep` run")
    ap.add_argument("--note", default="", help="conditions of that run (e.g. machine load), printed after its time")
    args = ap.parse_args()
    torch.set_num_threads(1)
    lines = ["### Deep networks (`ftlab reproduce deep`)", ""]
    if args.report is not None:
        wall, counts = report_wall(args.report)
        note = f" {args.note.strip()}" if args.note.strip() else ""
        lines += [f"Quick reproduction (`ftlab reproduce deep`, 2 worker processes): {wall}; {counts}.{note}", ""]
    t = train_step_times()
    g = geometry_times()
    lines += [
        "| measured side by side (1 thread) | time | ratio |",
        "|---|---|---|",
        f"| ResNet-18 w8 train step, batch 64, fp32 | {t['fp32'] * 1e3:.0f} ms | 1.00 |",
        f"| same, bf16 autocast (optional) | {t['bf16'] * 1e3:.0f} ms | {t['bf16'] / t['fp32']:.2f} |",
        f"| PR + ENSD + CKA, 256 x 6272, one-shot (Gram space) | {g['one_shot_6272'] * 1e3:.0f} ms | |",
        f"| PR + ENSD + CKA, 1024 x 784, one-shot | {g['one_shot_784'] * 1e3:.0f} ms | 1.00 |",
        f"| same, streamed in 4 batches (feature space, float64) | {g['streamed_784'] * 1e3:.0f} ms | "
        f"{g['streamed_784'] / g['one_shot_784']:.2f} |",
    ]
    print("\n".join(lines))
    write_section("deep", "\n".join(lines))


if __name__ == "__main__":
    main()
