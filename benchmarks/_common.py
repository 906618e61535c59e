"""Helpers shared by the benchmark scripts: timing, machine description, docs/benchmarks.md sections.

Each benchmark owns one section of ``docs/benchmarks.md`` between ``<!-- BEGIN name -->`` and
``<!-- END name -->`` markers and rewrites only that section, so scripts can run in any order.
"""

from __future__ import annotations

import os
import platform
import re
import time
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def machine() -> str:
    """One line describing where the numbers were measured."""
    import numpy as np

    cpu = platform.processor() or platform.machine()
    try:
        import torch

        tv = f", torch {torch.__version__} ({torch.get_num_threads()} threads)"
    except ImportError:
        tv = ""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    where = f"{cores} of {os.cpu_count()} cores" if cores != os.cpu_count() else f"{cores} cores"
    return f"{cpu}, {where}, Python {platform.python_version()}, numpy {np.__version__}{tv}"


def timeit(fn, *, repeat: int = 3, number: int = 1) -> float:
    """Best wall time (s) of ``number`` calls of ``fn`` over ``repeat`` repetitions."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def replace_block(path: Path, begin: str, end: str, body: str) -> Path:
    """Replace the text between the markers ``begin`` and ``end`` of ``path`` (markers kept) with
    ``body``, or append the marked block when the file (or the block) does not exist yet."""
    from ftlab.core.results import atomic_write_text

    block = f"{begin}\n{body.strip()}\n{end}"
    text = path.read_text() if path.exists() else ""
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    return atomic_write_text(path, text)


def write_section(name: str, markdown: str) -> Path:
    """Replace (or append) the section ``name`` of docs/benchmarks.md with ``markdown``."""
    if not DOC.exists():
        from ftlab.core.results import atomic_write_text

        atomic_write_text(DOC, "# Benchmarks\n")
    return replace_block(DOC, f"<!-- BEGIN {name} -->", f"<!-- END {name} -->",
                         f"{markdown.strip()}\n\n*Measured {time.strftime('%Y-%m-%d')} on: {machine()}.*")
