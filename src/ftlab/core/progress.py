"""Progress that stays quiet when it should.

Library code never prints. Long loops wrap their iterables with :func:`progress`: on an interactive
terminal it shows a tqdm bar; otherwise (CI logs, ``nohup``) it prints nothing -- unless the
command line turned on *stage lines* (:func:`set_stage_lines`, as every ``ftlab`` command does):
then each long loop prints one start line, a line every :data:`PERIOD` seconds with how far it got,
and one end line with its elapsed time to stderr, and
:func:`stage` brackets larger steps (report sections) the same way. ``--quiet`` silences both
(:func:`set_quiet`).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterable, Iterator

__all__ = ["PERIOD", "enabled", "progress", "set_quiet", "set_stage_lines", "stage"]

_QUIET = False
_STAGE_LINES = False


def set_quiet(quiet: bool) -> None:
    """Globally disable (``True``) or re-enable progress bars and stage lines."""
    global _QUIET
    _QUIET = bool(quiet)


def set_stage_lines(on: bool) -> None:
    """Print start/end lines with elapsed time to stderr for long loops and stages (the CLI turns this on)."""
    global _STAGE_LINES
    _STAGE_LINES = bool(on)


def enabled() -> bool:
    """Whether bars are shown: not quiet and stderr is a terminal."""
    return not _QUIET and sys.stderr.isatty()


def _lines() -> bool:
    return _STAGE_LINES and not _QUIET


def _say(text: str) -> None:
    print(f"ftlab: {text}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Print ``name: started`` and ``name: done in N s`` (or ``stopped after N s``) when stage lines are on."""
    t0 = time.perf_counter()
    if _lines():
        _say(f"{name}: started")
    done = False
    try:
        yield
        done = True
    finally:
        if _lines():
            _say(f"{name}: {'done in' if done else 'stopped after'} {time.perf_counter() - t0:.0f} s")


#: Seconds between progress lines of a long loop off a terminal.
PERIOD = 30.0


def _lined(iterable: Iterable, desc: str, total: int | None) -> Iterator:
    """Start and end lines, and a line every :data:`PERIOD` seconds in between (``desc: 12/40 after 31 s``)."""
    with stage(f"{desc} ({total} items)" if total is not None else desc):
        t0 = last = time.perf_counter()
        for i, item in enumerate(iterable, 1):
            yield item
            now = time.perf_counter()
            if now - last >= PERIOD:
                last = now
                _say(f"{desc}: {i}{'/' + str(total) if total is not None else ''} after {now - t0:.0f} s")


def progress(iterable: Iterable, *, desc: str | None = None, total: int | None = None, leave: bool = False):
    """Wrap ``iterable`` in a tqdm bar on a terminal, in start/end lines off it (when on), else return it."""
    if enabled():
        from tqdm.auto import tqdm

        return tqdm(iterable, desc=desc, total=total, leave=leave, dynamic_ncols=True)
    if _lines() and desc:
        return _lined(iterable, desc, total)
    return iterable
