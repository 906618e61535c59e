"""Argument checks shared by the whole library.

Every check raises :class:`ValueError` with one line naming the parameter, its value and the
allowed range, e.g. ``lam=1.5 is out of range: must be in [-1, 1]``. The CLI turns these into a
one-line message on stderr and exit status 2.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = [
    "check_finite",
    "check_positive",
    "check_nonnegative",
    "check_range",
    "check_int",
    "check_choice",
    "check_bool",
    "check_probability",
    "check_workers",
    "check_suffix",
    "check_memory",
    "check_work",
    "available_memory",
    "peak_rss_mb",
    "trim_memory",
]


def _fmt(value) -> str:
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, np.ndarray):
        return f"array(shape={value.shape})"
    return repr(value)


def check_finite(name: str, value):
    """Raise if ``value`` (a scalar or array-like) holds NaN or +-inf; return it unchanged."""
    if value is None:
        raise ValueError(f"{name} is None: a finite number is required")
    if isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool):
        if not math.isfinite(float(value)):
            raise ValueError(f"{name}={_fmt(value)} is not finite")
        return value
    arr = np.asarray(value)
    if arr.dtype.kind in "fc" and not np.all(np.isfinite(arr)):
        bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
        raise ValueError(f"{name} contains {bad} non-finite value(s) (NaN or inf)")
    return value


def check_positive(name: str, value) -> float:
    """Require a finite number > 0."""
    check_finite(name, value)
    if not value > 0:
        raise ValueError(f"{name}={_fmt(value)} is out of range: must be > 0")
    return value


def check_nonnegative(name: str, value) -> float:
    """Require a finite number >= 0."""
    check_finite(name, value)
    if not value >= 0:
        raise ValueError(f"{name}={_fmt(value)} is out of range: must be >= 0")
    return value


def check_range(name: str, value, lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False):
    """Require ``lo <= value <= hi`` (open ends on request) and finiteness."""
    check_finite(name, value)
    ok_lo = value > lo if lo_open else value >= lo
    ok_hi = value < hi if hi_open else value <= hi
    if not (ok_lo and ok_hi):
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        raise ValueError(f"{name}={_fmt(value)} is out of range: must be in {left}{lo:g}, {hi:g}{right}")
    return value


def check_probability(name: str, value) -> float:
    """Require a probability in [0, 1]."""
    return check_range(name, value, 0.0, 1.0)


def check_int(name: str, value, minimum: int = 0) -> int:
    """Require an integer (not bool) >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ValueError(f"{name}={_fmt(value)} is invalid: must be an integer >= {minimum}")
    if value < minimum:
        raise ValueError(f"{name}={value} is out of range: must be an integer >= {minimum}")
    return int(value)


def check_choice(name: str, value, choices: Iterable):
    """Require ``value`` to be one of ``choices``."""
    choices = list(choices)
    if value not in choices:
        raise ValueError(f"{name}={_fmt(value)} is invalid: must be one of {', '.join(map(str, choices))}")
    return value


def check_bool(name: str, value) -> bool:
    """Require ``value`` to be a bool (not 0/1, not a string)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name}={_fmt(value)} is invalid: must be true or false")
    return value


def check_workers(workers) -> int | None:
    """``None`` (all cores) or an integer >= 1: the same rule for ``--workers`` in every command."""
    return None if workers is None else check_int("workers", workers, minimum=1)


def check_suffix(name: str, path, suffixes: Iterable[str]):
    """Require an output path to end in one of ``suffixes`` (e.g. ``(".png",)``); returns it."""
    from pathlib import Path

    allowed = [x.lower() for x in suffixes]
    if Path(path).suffix.lower() not in allowed:
        raise ValueError(f"{name}={str(path)!r} has the wrong extension: must end in {' or '.join(allowed)}")
    return path


def available_memory() -> int:
    """Bytes of memory available to a new allocation (``MemAvailable`` on Linux; a large number elsewhere)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 50


def peak_rss_mb() -> float:
    """Peak resident memory of this process (MB): ``VmHWM`` on Linux, else ``getrusage``.

    ``ru_maxrss`` survives ``exec``, so a child started from a large parent would report the
    parent's peak; ``VmHWM`` belongs to the current address space.
    """
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


_LIBC: Any = None


def trim_memory() -> None:
    """Return freed heap memory to the operating system (glibc's ``malloc_trim``; a no-op elsewhere).

    glibc keeps freed buffers of up to 32 MB in its heap, so a loop that allocates and frees large
    temporaries (the rows of each calibration batch) keeps its peak resident memory long after the
    buffers are gone; a trim after each batch or solve gives them back. glibc's mmap threshold is left
    as it is: fixing it at 1 MB mapped every temporary of 1 MB or more afresh, and the page faults of
    those fresh mappings made the EfficientNet-Lite0 -> Lite2 calibration pass about 1.5x slower
    (trimming alone keeps the peak within a few percent).
    """
    global _LIBC
    if _LIBC is None:
        import ctypes
        import ctypes.util

        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC = lib if hasattr(lib, "malloc_trim") else False
        except OSError:
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_memory(what: str, nbytes: float, *, hint: str = "") -> None:
    """Refuse, before any work, a run whose largest allocation (``nbytes``) cannot fit in memory."""
    avail = available_memory()
    if nbytes > 0.8 * avail:
        raise ValueError(f"{what} needs about {_gib(nbytes)} of memory, more than this machine can give "
                         f"({_gib(avail)} available){': ' + hint if hint else ''}")


def check_work(what: str, n: int, limit: int, *, allow: bool, flag: str = "--yes") -> None:
    """Refuse a merely long run (``n`` units of work above ``limit``) unless the user passed ``flag``."""
    if n > limit and not allow:
        raise ValueError(f"{what} is {n:,} (more than {limit:,}): this would run for a long time; "
                         f"reduce it or pass {flag} to run anyway")
