"""Progress bars that stay quiet when they should.

Library code never prints; long loops wrap their iterables with :func:`progress`, which shows a
tqdm bar on an interactive terminal and nothing otherwise (or when :func:`set_quiet` was called,
as the CLI's ``--quiet`` does).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

_QUIET = False


def set_quiet(quiet: bool) -> None:
    """Globally disable (``True``) or re-enable progress bars."""
    global _QUIET
    _QUIET = bool(quiet)


def enabled() -> bool:
    """Whether bars are shown: not quiet and stderr is a terminal."""
    return not _QUIET and sys.stderr.isatty()


def progress(iterable: Iterable, *, desc: str | None = None, total: int | None = None, leave: bool = False):
    """Wrap ``iterable`` in a tqdm bar when :func:`enabled`, else return it unchanged."""
    if not enabled():
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, leave=leave, dynamic_ncols=True)
