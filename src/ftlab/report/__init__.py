"""The reproduction report: ``ftlab reproduce`` -> ``<out>/report.md``.

The report is assembled from *sections*, one per part of ftlab. Each section is a function
``run(ctx: ReportContext) -> str`` returning Markdown (figure links relative to ``ctx.out_dir``)
and writing its tables and figures under ``ctx.out_dir``. A section is written to
``<out>/sections/<name>.md`` as soon as it finishes; ``report.md`` is re-assembled from every
section file present, so running one section (``ftlab reproduce replica``) refreshes it without
losing the others. A section whose real data are not installed says so instead of failing.

Each section module may declare ``FIGURES`` (its named figures); ``--figure`` names that no
chosen section declares are refused before anything runs. While a report runs, its output folder
is locked (:func:`ftlab.core.results.output_lock`): a second ``ftlab reproduce`` on the same
``--out`` is refused. Sections print start and end lines with their elapsed time (stage lines).
"""

from __future__ import annotations

import datetime as _dt
import importlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftlab import __version__
from ftlab.core.progress import stage
from ftlab.core.results import atomic_write_text, output_lock

log = logging.getLogger(__name__)

# name -> ("module:function", title). Order = order in the report.
SECTIONS: dict[str, tuple[str, str]] = {
    "dln": ("ftlab.report.dln:run", "Diagonal linear networks: the paper's claims"),
    "replica": ("ftlab.report.replica:run", "Replica theory: learning curves and ftlab's checks"),
    "deep": ("ftlab.report.deep:run", "Initialization scales in deep networks"),
    "transfer": ("ftlab.report.transfer:run", "Training-free task-vector transfer (BiCo)"),
}


#: What ``--full`` means, the same words in the README, ``ftlab --help`` and ``ftlab reproduce --help``.
FULL_SCALE = "larger runs (about 2 hours per section on 2 cores), still far below the papers' scale"


class DataUnavailable(RuntimeError):
    """A section's real dataset or weights are not installed; the message says how to get them."""


@dataclass(frozen=True)
class ReportContext:
    """What every section receives.

    out_dir : folder of the report; a section writes under ``out_dir / <section name>``.
    full : the larger run (see :data:`FULL_SCALE`) instead of the quick default.
    figures : optional subset of a section's named figures (``None`` = all).
    workers / scheduler : passed to :func:`ftlab.core.sweep.run_sweep`.
    seed : base seed.
    """

    out_dir: Path
    full: bool = False
    figures: tuple[str, ...] | None = None
    workers: int | None = None
    scheduler: Any = None
    seed: int = 0

    def section_dir(self, name: str) -> Path:
        d = self.out_dir / name
        d.mkdir(parents=True, exist_ok=True)
        return d

    def wants(self, figure: str) -> bool:
        return self.figures is None or figure in self.figures


def _load(name: str):
    target = SECTIONS[name][0]
    mod, attr = target.split(":")
    return getattr(importlib.import_module(mod), attr)


def section_figures(name: str) -> tuple[str, ...]:
    """The named figures a section declares (``FIGURES`` of its module; empty if none)."""
    mod = SECTIONS[name][0].split(":")[0]
    return tuple(getattr(importlib.import_module(mod), "FIGURES", ()))


def check_figures(names: list[str], figures: tuple[str, ...] | None) -> None:
    """Refuse ``--figure`` names that none of the chosen sections declares."""
    if not figures:
        return
    known = {f: n for n in names for f in section_figures(n)}
    unknown = [f for f in figures if f not in known]
    if unknown:
        listing = "; ".join(f"{n}: {', '.join(section_figures(n)) or '(none)'}" for n in names)
        raise ValueError(f"figure={unknown[0]!r} is unknown for the chosen sections ({listing})")


def run_report(ctx: ReportContext, sections: list[str] | None = None) -> tuple[Path, dict[str, str]]:
    """Run the named sections (all by default) and assemble ``report.md``.

    Returns the report path and ``{section: status}`` with status ``ok``, ``skipped: ...`` or
    ``failed: ...``. A failing section does not stop the others. Unknown section or figure names,
    and an output folder in use by another run, raise ``ValueError`` before anything runs.
    """
    names = list(SECTIONS) if not sections else sections
    for n in names:
        if n not in SECTIONS:
            raise ValueError(f"section={n!r} is unknown: choose from {', '.join(SECTIONS)}")
    check_figures(names, ctx.figures)
    with output_lock(ctx.out_dir):
        ctx.out_dir.mkdir(parents=True, exist_ok=True)
        sec_dir = ctx.out_dir / "sections"
        status: dict[str, str] = {}
        for n in names:
            status[n] = _run_section(ctx, n, sec_dir)
        return _assemble(ctx), status


def _run_section(ctx: ReportContext, n: str, sec_dir: Path) -> str:
    title = SECTIONS[n][1]
    mode = "full" if ctx.full else "quick"
    t0 = time.perf_counter()
    with stage(f"section {n} ({mode})"):
        try:
            body = _load(n)(ctx)
            status = "ok"
        except DataUnavailable as exc:
            body = f"*Skipped: {exc}*\n"
            status = f"skipped: {exc}"
        except Exception as exc:  # noqa: BLE001 - a failing section must not lose the others
            log.exception("section %s failed", n)
            body = f"*This section failed: `{type(exc).__name__}: {exc}`*\n"
            status = f"failed: {type(exc).__name__}: {exc}"
    wall = time.perf_counter() - t0
    text = f"## {title}\n\n<!-- section {n}: {mode} run, {wall:.0f} s -->\n\n{body.strip()}\n\n"
    text += f"*Section `{n}`: {mode} run, wall time {wall:.0f} s.*\n"
    atomic_write_text(sec_dir / f"{n}.md", text)
    return status


def _assemble(ctx: ReportContext) -> Path:
    sec_dir = ctx.out_dir / "sections"
    parts = [
        "# ftlab reproduction report\n",
        f"ftlab {__version__}, assembled {_dt.datetime.now().isoformat(timespec='seconds')}. "
        "Each section states the claims of the paper it reproduces, in ftlab's quoted words, next to what "
        "ftlab computed, with one verdict per claim: **reproduced**, **reversed** (confidently the other "
        "way), **no effect** (inside a stated margin) or **inconclusive**, always with its interval. "
        "ftlab's own findings are listed apart and not counted. Numbers come from this run; nothing is "
        "copied from the papers except where a table says *paper*. Details marked [U] are ftlab's "
        "options with documented defaults, not confirmed choices of the papers.\n",
    ]
    toc = []
    for n, (_, title) in SECTIONS.items():
        f = sec_dir / f"{n}.md"
        if f.exists():
            toc.append(f"- [{title}](#{_anchor(title)})")
            parts.append(f.read_text())
        else:
            toc.append(f"- {title}: not run yet (`ftlab reproduce {n}`)")
    parts.insert(2, "\n".join(toc) + "\n")
    return atomic_write_text(ctx.out_dir / "report.md", "\n".join(parts))


def _anchor(title: str) -> str:
    keep = "".join(ch for ch in title.lower() if ch.isalnum() or ch in " -")
    return keep.replace(" ", "-")
