"""One sweep runner for every grid in ftlab: local process pool or Dask, resumable.

A sweep maps a picklable, top-level function ``fn(**point) -> dict | list[dict]`` over a list of
parameter points. Each finished point is appended, as one JSON line, to a *store* file and
fsync'ed; restarting the same sweep with the same store recomputes nothing that finished (points
are keyed by a hash of the function name and the point's parameters), and a truncated last line
left by a kill is ignored. The result is a tidy DataFrame: one row per output record, with the
point's parameters as columns.

Executors:

* ``scheduler=None, workers=1``: in-process, serial (simplest to debug).
* ``scheduler=None, workers>1`` (default ``os.cpu_count()``): a local ``ProcessPoolExecutor``.
* ``scheduler="tcp://host:port"`` (or a ``dask.distributed.Client``): a Dask cluster; start
  one with ``dask scheduler`` / ``dask worker`` or ``dask.distributed.LocalCluster``.

Example::

    from ftlab.core.sweep import run_sweep, grid
    df = run_sweep(my_fn, grid(alpha=[0.1, 0.2], seed=range(3)), store="runs/sweep.jsonl")
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

from ftlab.core.progress import progress
from ftlab.core.results import to_jsonable

__all__ = ["grid", "point_key", "run_sweep", "read_store"]


def grid(**axes: Iterable) -> list[dict]:
    """Cartesian product of named axes as a list of dicts (last axis varies fastest)."""
    names = list(axes)
    values = [list(v) for v in axes.values()]
    for n, v in zip(names, values):
        if len(v) == 0:
            raise ValueError(f"sweep axis {n!r} is empty")
    return [dict(zip(names, combo)) for combo in itertools.product(*values)]


def _fn_name(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def point_key(fn: Callable, point: dict) -> str:
    """Stable key of one point of one function (sha1 of canonical JSON)."""
    payload = json.dumps({"fn": _fn_name(fn), "point": to_jsonable(point)}, sort_keys=True)
    return hashlib.sha1(payload.encode()).hexdigest()[:16]


def read_store(store: str | os.PathLike) -> dict[str, dict]:
    """Finished points of a store file, ``{key: {"point":..., "records":[...]}}``.

    A malformed line -- a write cut short by a kill, bytes that are not UTF-8 or not JSON, an entry
    without a string ``key`` and a list of record objects -- is skipped: that point is simply recomputed.
    """
    store = Path(store)
    done: dict[str, dict] = {}
    if not store.exists():
        return done
    with open(store, "rb") as fh:
        for raw in fh:
            try:
                entry = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                continue
            if (isinstance(entry, dict) and isinstance(entry.get("key"), str) and isinstance(entry.get("records"), list)
                    and all(isinstance(r, dict) for r in entry["records"])):
                done[entry["key"]] = entry
    return done


def _append(store: Path, entry: dict) -> None:
    line = json.dumps(to_jsonable(entry), sort_keys=True) + "\n"
    # A previous kill may have left a line without its newline: start on a fresh line.
    needs_nl = store.exists() and store.stat().st_size > 0 and _last_byte(store) != b"\n"
    with open(store, "a", encoding="utf-8") as fh:
        if needs_nl:
            fh.write("\n")
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(-1, os.SEEK_END)
        return fh.read(1)


def _call(fn: Callable, point: dict) -> list[dict]:
    out = fn(**point)
    if isinstance(out, dict):
        out = [out]
    if not isinstance(out, list) or not all(isinstance(r, dict) for r in out):
        raise TypeError(f"sweep function {_fn_name(fn)} must return a dict or a list of dicts")
    return out


def run_sweep(
    fn: Callable[..., dict | list[dict]],
    points: Sequence[dict],
    *,
    store: str | os.PathLike | None = None,
    scheduler: Any = None,
    workers: int | None = None,
    desc: str | None = None,
):
    """Evaluate ``fn(**point)`` for every point; return a tidy :class:`pandas.DataFrame`.

    Parameters
    ----------
    fn : top-level picklable callable returning a dict or a list of dicts (output records).
    points : parameter dicts (e.g. from :func:`grid`). Keys become DataFrame columns.
    store : JSON-lines file; finished points are appended there and skipped on restart.
    scheduler : ``None`` for a local process pool, a Dask scheduler address, or a
        ``dask.distributed.Client``.
    workers : local pool size (default ``os.cpu_count()``); 1 runs serially in-process.
    desc : progress-bar label.

    Raises whatever a point raises, after every point finished before it has been stored.
    """
    import pandas as pd

    points = [dict(p) for p in points]
    keys = [point_key(fn, p) for p in points]
    if len(set(keys)) != len(keys):
        raise ValueError("sweep points are not unique: two points have identical parameters")
    store_path = Path(store) if store is not None else None
    done = read_store(store_path) if store_path is not None else {}
    if store_path is not None:
        store_path.parent.mkdir(parents=True, exist_ok=True)
    todo = [(k, p) for k, p in zip(keys, points) if k not in done]
    results: dict[str, list[dict]] = {k: done[k]["records"] for k in keys if k in done}

    def finish(key: str, point: dict, records: list[dict]) -> None:
        results[key] = records
        if store_path is not None:
            _append(store_path, {"key": key, "point": point, "records": records})

    if todo:
        if scheduler is not None:
            _run_dask(fn, todo, scheduler, finish, desc)
        elif (workers or os.cpu_count() or 1) <= 1 or len(todo) == 1:
            for k, p in progress(todo, desc=desc, total=len(todo)):
                finish(k, p, _call(fn, p))
        else:
            _run_pool(fn, todo, workers or os.cpu_count() or 1, finish, desc)

    rows = []
    for k, p in zip(keys, points):
        for rec in results[k]:
            rows.append({**p, **rec})
    return pd.DataFrame(rows)


def _watch_parent(parent: int, period: float = 0.5) -> None:
    """Exit this worker as soon as its parent is gone (e.g. killed with SIGKILL): no orphans."""
    while True:
        if os.getppid() != parent:
            os._exit(1)
        time.sleep(period)


def _worker_init(parent: int) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it cancels the pool
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent's SIGTERM handler (an exception) would not end us
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="ftlab-parent-watch").start()


def _run_pool(fn, todo, workers, finish, desc):
    bar = progress(range(len(todo)), desc=desc, total=len(todo))
    it = iter(bar) if bar is not None else None
    ex = ProcessPoolExecutor(max_workers=min(workers, len(todo)), initializer=_worker_init, initargs=(os.getpid(),))
    futs = {ex.submit(_call, fn, p): (k, p) for k, p in todo}
    pending = set(futs)
    try:
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in finished:
                k, p = futs[f]
                finish(k, p, f.result())
                if it is not None:
                    next(it, None)
    except BaseException:
        # stop at once (finished points are already stored): cancel what has not started, end the workers
        procs = list(getattr(ex, "_processes", {}).values())
        ex.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            proc.terminate()
        close = getattr(it, "close", None)
        if close is not None:
            close()  # its end line says "stopped after"
        raise
    ex.shutdown(wait=True)
    if it is not None:
        next(it, None)  # exhaust the progress iterator: its end line says "done"


def _run_dask(fn, todo, scheduler, finish, desc):
    try:
        from dask.distributed import Client, as_completed
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ValueError("scheduler given but dask.distributed is not installed: pip install 'ftlab[dask]'") from exc
    own = not isinstance(scheduler, Client)
    client = Client(scheduler) if own else scheduler
    try:
        futs = {client.submit(_call, fn, p, pure=False): (k, p) for k, p in todo}
        for f in progress(as_completed(list(futs)), desc=desc, total=len(futs)):
            k, p = futs[f]
            finish(k, p, f.result())
    finally:
        if own:
            client.close()
