"""Benchmark: wall times of the ``deep`` reproduction, and the speed choices behind its protocol.

* ``--report DIR`` / ``--full-report DIR``: read the wall time of a finished ``ftlab reproduce deep``
  (quick) / ``ftlab reproduce deep --full`` run from ``DIR/sections/deep.md`` and count its runs
  from the tables (targets: quick run a few minutes, full run about 2 hours on 2 cores). The
  reproduction itself is not rerun here.
* Side by side in one process, one thread: a training step (batch 64) of both vision architectures at
  the protocol's size (width 8, 14x14 inputs) against 28x28 inputs and width 16 (why the protocol
  downsamples), and bf16 autocast / channels-last, each tried in a subprocess because they have
  crashed (segfault) in torch 2.13.0+cpu on CPUs without AVX-512; the cost of :func:`ftlab.deep.rebalance_`
  (torch.fx trace and least-squares solve) on a ResNet-18.

Run: ``.venv/bin/python benchmarks/bench_deep.py --report /tmp/rep --full-report /tmp/rep-full``
(about a minute without the reports' runs). Results go to docs/benchmarks.md (section ``deep``).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import timeit, write_section  # noqa: E402
from ftlab.deep import rebalance_  # noqa: E402
from ftlab.models.cnn import nf_resnet18  # noqa: E402
from ftlab.models.resnet import resnet18  # noqa: E402

_STEP = """
import sys, time, torch
from ftlab.models.cnn import nf_resnet18
from ftlab.models.resnet import resnet18
torch.set_num_threads(1)
arch, width, hw, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
build = resnet18 if arch == "resnet18" else nf_resnet18
model = build(num_classes=10, width=width, in_channels=1, seed=0)
X, y = torch.randn(64, 1, hw, hw), torch.randint(0, 10, (64,))
if mode == "channels_last":
    model, X = model.to(memory_format=torch.channels_last), X.contiguous(memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
def step():
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "bf16"):
        loss = torch.nn.functional.cross_entropy(model(X), y)
    loss.backward()
    opt.step()
step()
best = float("inf")
for _ in range(5):
    t = time.perf_counter(); step(); best = min(best, time.perf_counter() - t)
print(best)
"""


def step_time(arch: str, width: int, hw: int, mode: str = "fp32") -> str:
    """Best of 5 training steps (batch 64) in a fresh subprocess: ``"123 ms"`` or why it failed."""
    r = subprocess.run([sys.executable, "-c", _STEP, arch, str(width), str(hw), mode], capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0:
        return f"crashed (exit {r.returncode}{', segfault' if r.returncode in (-11, 139) else ''})"
    return f"{float(r.stdout.strip().splitlines()[-1]) * 1e3:.0f} ms"


def report_wall(folder: Path) -> tuple[str, str]:
    text = (folder / "sections" / "deep.md").read_text()
    m = re.search(r"section deep: (\w+) run, (\d+) s", text)
    if not m:
        raise SystemExit(f"{folder}/sections/deep.md has no wall-time marker")
    import pandas as pd

    d = folder / "deep"
    counts = ", ".join(f"{len(pd.read_csv(d / f))} {f[:-4].replace('_', ' ')} runs"
                       for f in ("vision_pt_tune.csv", "vision_pt.csv", "vision_ft_tune.csv", "vision_ft.csv",
                                 "modular_pt_tune.csv", "modular_pt.csv", "modular_ft_tune.csv", "modular_ft.csv")
                       if (d / f).exists())
    s = int(m.group(2))
    return f"{m.group(1)} run: **{s} s** ({s / 60:.1f} min)", counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report", type=Path, default=None, help="folder of a finished `ftlab reproduce deep` run")
    ap.add_argument("--full-report", type=Path, default=None, help="folder of a finished `--full` run")
    ap.add_argument("--note", default="", help="conditions of those runs (machine load, date), printed after them")
    args = ap.parse_args()
    torch.set_num_threads(1)
    lines = ["### Deep networks (`ftlab reproduce deep`)", ""]
    for label, folder in (("Quick reproduction (`ftlab reproduce deep`, 2 worker processes)", args.report),
                          ("Full run (`ftlab reproduce deep --full`, 2 worker processes)", args.full_report)):
        if folder is not None:
            wall, counts = report_wall(folder)
            lines += [f"{label}: {wall}; {counts}.", ""]
    if args.note.strip():
        lines += [args.note.strip(), ""]
    rows = [("resnet18", 8, 14, "fp32"), ("nf_resnet18", 8, 14, "fp32"), ("resnet18", 8, 28, "fp32"),
            ("resnet18", 16, 14, "fp32"), ("resnet18", 8, 14, "bf16"), ("resnet18", 8, 14, "channels_last"),
            ("resnet18", 4, 28, "bf16")]
    lines += ["| training step, batch 64, 1 thread | time |", "|---|---|"]
    for arch, width, hw, mode in rows:
        note = " (the protocol's size)" if (width, hw, mode) == (8, 14, "fp32") else ""
        lines.append(f"| {arch} width {width}, {hw}x{hw}, {mode}{note} | {step_time(arch, width, hw, mode)} |")
    bn = resnet18(width=8, in_channels=1, num_classes=10, seed=0)
    nf = nf_resnet18(width=8, in_channels=1, num_classes=10, seed=0)
    t_bn = timeit(lambda: rebalance_(bn, 1.0, normalization="absorb"), repeat=3)
    t_nf = timeit(lambda: rebalance_(nf, 1.0), repeat=3)
    lines += [f"| `rebalance_` (trace, solve, apply) on the BatchNorm / normalization-free ResNet-18 | "
              f"{t_bn * 1e3:.0f} / {t_nf * 1e3:.0f} ms |"]
    print("\n".join(lines))
    write_section("deep", "\n".join(lines))


if __name__ == "__main__":
    main()
