"""The reproduction report: ``ftlab reproduce`` -> ``<out>/report.md``.

The report is assembled from *sections*, one per part of ftlab. Each section is a function
``run(ctx: ReportContext) -> str`` returning Markdown (figure links relative to ``ctx.out_dir``).
It writes its tables and figures into ``ctx.output_dir(name)`` and keeps its resumable sweep
stores and caches in ``ctx.section_dir(name)``. A section is one output set (see
:func:`ftlab.core.results.staged_output`): its Markdown (``<out>/sections/<name>.md``) and the files
it wrote to ``output_dir`` replace the previous ones together, only when the section finished, so
a section that fails, is skipped or is interrupted leaves an earlier complete one as it was (the
report then says that the rerun failed) and its sweeps resume. ``report.md`` is re-assembled from
every section file present, so running one section (``ftlab reproduce replica``) refreshes it
without losing the others. A section whose real data are not installed (:class:`ftlab.data.DatasetMissing`) says so and is
skipped instead of failing.

Each section module may declare ``FIGURES`` (its named figures); ``--figure`` names that no
chosen section declares are refused before anything runs. While a report runs, its output folder
is locked (:func:`ftlab.core.results.output_lock`): a second ``ftlab reproduce`` on the same
``--out`` is refused. Sections print start and end lines with their elapsed time (stage lines).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import importlib
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftlab import __version__
from ftlab.core.progress import stage
from ftlab.core.results import atomic_write_text, output_lock, staged_output

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


@dataclass(frozen=True)
class ReportContext:
    """What every section receives.

    out_dir : folder of the report.
    full : the larger run (see :data:`FULL_SCALE`) instead of the quick default.
    figures : optional subset of a section's named figures (``None`` = all).
    workers / scheduler : passed to :func:`ftlab.core.sweep.run_sweep`.
    seed : base seed (>= 0).
    stage : while :func:`run_report` runs a section, the staging folder of its output set (set by it).
    """

    out_dir: Path
    full: bool = False
    figures: tuple[str, ...] | None = None
    workers: int | None = None
    scheduler: Any = None
    seed: int = 0
    stage: Path | None = None

    def section_dir(self, name: str) -> Path:
        """``out_dir/name``, kept across runs: a section's sweep stores and caches (so a rerun resumes)."""
        d = self.out_dir / name
        d.mkdir(parents=True, exist_ok=True)
        return d

    def output_dir(self, name: str) -> Path:
        """Where a section writes its tables and figures: they appear in ``out_dir/name`` together with its
        Markdown when the section succeeds (inside :func:`run_report`; directly there otherwise)."""
        d = (self.stage if self.stage is not None else self.out_dir) / name
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


def run_report(ctx: ReportContext, sections: list[str] | None = None) -> tuple[Path | None, dict[str, str]]:
    """Run the named sections (all by default) and assemble ``report.md``.

    Returns the report path (``None`` when it could not be written, e.g. on a full disk: the previous
    ``report.md`` is then unchanged and ``status["report.md"]`` says why) and ``{section: status}``
    with status ``ok``, ``skipped: ...`` or ``failed: ...`` (``failed (internal error): ...`` for a
    defect of ftlab); a section that did not finish keeps an earlier complete version, and its status
    says so. A failing section does not stop the others. Unknown section or figure names, a negative
    seed, and an output folder in use by another run raise ``ValueError`` before anything runs.
    """
    from ftlab.core.validate import check_int

    check_int("seed", ctx.seed, 0)
    names = list(SECTIONS) if not sections else sections
    for n in names:
        if n not in SECTIONS:
            raise ValueError(f"section={n!r} is unknown: choose from {', '.join(SECTIONS)}")
    check_figures(names, ctx.figures)
    with output_lock(ctx.out_dir):
        status: dict[str, str] = {}
        notes: dict[str, str] = {}
        for n in names:
            status[n], note = _run_section(ctx, n)
            if note:
                notes[n] = note
        try:
            return _assemble(ctx, notes), status
        except OSError as exc:
            status["report.md"] = f"not updated (the previous one is kept): {_one_line(exc)}"
            return None, status


class _KeepEarlier(Exception):
    """A section did not finish and an earlier complete version exists: its output set is left as it was."""


#: How the body of a section that did not finish begins (after its header comment).
_UNFINISHED = ("-->\n\n*This section failed:", "-->\n\n*Skipped:")


def _complete(path: Path) -> bool:
    """Whether ``path`` holds a section that finished (not a failure or skip note)."""
    if not path.is_file():
        return False
    text = path.read_text(encoding="utf-8", errors="replace")
    return not any(m in text for m in _UNFINISHED)


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _section_body(ctx: ReportContext, n: str) -> tuple[str, str]:
    """The Markdown body and status of one run of section ``n``."""
    from ftlab.core.usercode import culprit
    from ftlab.data import DatasetMissing

    try:
        return _load(n)(ctx), "ok"
    except DatasetMissing as exc:  # the section's real data or weights are not installed: the message says how
        return f"*Skipped: {exc}*\n", f"skipped: {exc}"
    except Exception as exc:  # noqa: BLE001 - a failing section must not lose the others
        log.info("section %s failed", n, exc_info=True)
        ours = not isinstance(exc, (ValueError, OSError, MemoryError)) and culprit(exc)[0] != "user"
        text = _one_line(exc)
        if ctx.stage is not None:
            text = text.replace(str(ctx.stage), str(ctx.out_dir))
        return f"*This section failed: `{text}`*\n", f"failed{' (internal error)' if ours else ''}: {text}"


def _run_section(ctx: ReportContext, n: str) -> tuple[str, str | None]:
    """Run section ``n`` as one output set; returns its status and, when an earlier version was kept, a note."""
    title = SECTIONS[n][1]
    mode = "full" if ctx.full else "quick"
    complete = _complete(ctx.out_dir / "sections" / f"{n}.md")
    t0 = time.perf_counter()
    status = "failed"
    try:
        with stage(f"section {n} ({mode})"), staged_output(ctx.out_dir, name=f"section-{n}") as st:
            body, status = _section_body(dataclasses.replace(ctx, stage=st), n)
            if status != "ok" and complete:
                raise _KeepEarlier(status)
            if status != "ok":
                shutil.rmtree(st / n, ignore_errors=True)  # no partial tables beside a failure note
            wall = time.perf_counter() - t0
            text = f"## {title}\n\n<!-- section {n}: {mode} run, {wall:.0f} s -->\n\n{body.strip()}\n\n"
            text += f"*Section `{n}`: {mode} run, wall time {wall:.0f} s.*\n"
            atomic_write_text(st / "sections" / f"{n}.md", text)
    except _KeepEarlier:
        pass
    except OSError as exc:  # the section's files could not be put in place (e.g. a full disk)
        status = f"failed: {_one_line(exc)}"
    if status == "ok":
        return status, None
    when = _dt.datetime.now().isoformat(timespec="seconds")
    if complete:
        return f"{status} (the earlier complete section is kept)", f"the rerun of {when} did not finish ({status}); " \
            "the section shown is the earlier complete run"
    return status, None


def _assemble(ctx: ReportContext, notes: dict[str, str] | None = None) -> Path:
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
            text, note = f.read_text(encoding="utf-8", errors="replace"), (notes or {}).get(n)
            parts.append(text.replace("\n", f"\n\n*Note: {note}.*\n", 1) if note else text)
        else:
            toc.append(f"- {title}: not run yet (`ftlab reproduce {n}`)")
    parts.insert(2, "\n".join(toc) + "\n")
    return atomic_write_text(ctx.out_dir / "report.md", "\n".join(parts))


def _anchor(title: str) -> str:
    keep = "".join(ch for ch in title.lower() if ch.isalnum() or ch in " -")
    return keep.replace(" ", "-")
