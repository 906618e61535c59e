"""Worker processes and background jobs of the page, so that no computation blocks the controls.

The closed forms (:func:`~ftlab.explore.views.point_view`) take milliseconds and run in the server's
request thread. Everything slower runs in its own worker *process* (a thread would hold the
interpreter lock and stall the closed forms behind it): one process for the current learning curve,
one for the corners' curves (cached there per task), and one for jobs -- the advisor and the
simulated networks -- which the page starts, polls for progress and may cancel.
"""

from __future__ import annotations

import itertools
import multiprocessing
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field

__all__ = ["ROLES", "Job", "JobTable", "Workers", "one_line"]

#: One worker process per role.
ROLES = ("curve", "corners", "jobs")


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message (its class name when empty)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


class Workers:
    """One single-process pool per role of :data:`ROLES` (``spawn`` processes, started on first use).

    ``submit(role, fn, *args)`` returns a :class:`~concurrent.futures.Future`; a pool whose process
    died is replaced once. ``close()`` cancels what is queued and stops the processes.
    """

    def __init__(self):
        self._ctx = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()
        self._pools: dict[str, ProcessPoolExecutor] = {}

    def _pool(self, role: str, *, fresh: bool = False) -> ProcessPoolExecutor:
        with self._lock:
            if fresh and role in self._pools:
                self._pools.pop(role).shutdown(wait=False, cancel_futures=True)
            if role not in self._pools:
                self._pools[role] = ProcessPoolExecutor(max_workers=1, mp_context=self._ctx)
            return self._pools[role]

    def submit(self, role: str, fn, *args, **kwargs) -> Future:
        if role not in ROLES:
            raise ValueError(f"role={role!r} is invalid: must be one of {', '.join(ROLES)}")
        try:
            return self._pool(role).submit(fn, *args, **kwargs)
        except BrokenProcessPool:
            return self._pool(role, fresh=True).submit(fn, *args, **kwargs)

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.shutdown(wait=False, cancel_futures=True)
        for pool in pools:
            pool.shutdown(wait=True)


@dataclass
class Job:
    """A background computation of the page: ``kind`` ("advise" or "simulate"), the knobs and
    parameters it was started with, and one future per unit of work (progress = units done)."""

    id: str
    kind: str
    knobs: dict
    params: dict
    futures: list[Future]
    started: float = field(default_factory=time.monotonic)
    cancelled: bool = False

    def cancel(self) -> None:
        """Cancel the units not yet started (a running unit finishes; its result is kept)."""
        self.cancelled = True
        for f in self.futures:
            f.cancel()

    def status(self) -> dict:
        """``id, kind, state`` (running, done, cancelled, error), ``done``/``total`` units, ``results``
        (finished units in start order), ``error`` (one line or ``None``), ``elapsed`` seconds, ``knobs``, ``params``."""
        finished = [f for f in self.futures if f.done() and not f.cancelled()]
        failed = [exc for exc in (f.exception() for f in finished) if exc is not None]
        results = [f.result() for f in finished if f.exception() is None]
        if failed:
            state = "error"
        elif len(finished) == len(self.futures):
            state = "done"
        elif self.cancelled:
            state = "cancelled" if not any(f.running() for f in self.futures) else "running"
        else:
            state = "running"
        return {"id": self.id, "kind": self.kind, "state": state, "done": len(finished), "total": len(self.futures),
                "results": results, "error": one_line(failed[0]) if failed else None,
                "elapsed": time.monotonic() - self.started, "knobs": self.knobs, "params": self.params}


class JobTable:
    """The page's jobs by id (the last ``keep``); starting a job cancels the unfinished one of the same kind."""

    def __init__(self, workers: Workers, *, keep: int = 16):
        self._workers = workers
        self._keep = keep
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def start(self, kind: str, *, knobs: dict, params: dict, calls: list[tuple]) -> Job:
        """Start a job of ``kind`` with one unit per ``(fn, args, kwargs)`` of ``calls``, run in the jobs process."""
        with self._lock:
            for job in self._jobs.values():
                if job.kind == kind and not job.cancelled:
                    job.cancel()
            futures = [self._workers.submit("jobs", fn, *args, **kwargs) for fn, args, kwargs in calls]
            job = Job(id=f"{kind}-{next(self._ids)}", kind=kind, knobs=knobs, params=params, futures=futures)
            self._jobs[job.id] = job
            while len(self._jobs) > self._keep:
                self._jobs.popitem(last=False)
            return job

    def get(self, job_id: str) -> Job:
        """The job ``job_id`` (``ValueError`` naming it when unknown or forgotten)."""
        with self._lock:
            if job_id not in self._jobs:
                raise ValueError(f"job={job_id!r} is unknown (only the last {self._keep} jobs are kept)")
            return self._jobs[job_id]
