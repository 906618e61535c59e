"""Worker processes and background jobs of the page, so that no computation blocks the controls.

The closed forms (:func:`~ftlab.explore.views.point_view`) take milliseconds and run in the server's
request thread. Everything slower runs in a worker *process* (a thread would hold the interpreter
lock and stall the closed forms behind it): one process for the current learning curve, one for the
corners' curves (cached there per task), and one for jobs -- the advisor and the simulated
networks -- which the page starts, polls for progress and may cancel. Workers run at a lower
priority than the server, ignore Ctrl-C (the server stops them) and are terminated on close.

Like every program that starts ``spawn`` processes, a script that starts the server must guard its
entry point with ``if __name__ == "__main__":`` (the ``ftlab`` command does).
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import multiprocessing.pool
import os
import signal
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

__all__ = ["ROLES", "Job", "JobTable", "Workers", "one_line"]

#: One worker process per role, with the niceness it adds to its priority: the server's request threads (the
#: closed forms) and the browser come first, then the current curve, the corners' curves, the jobs.
ROLES = {"curve": 5, "corners": 10, "jobs": 15}


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message (its class name when empty)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _worker_init(niceness: int) -> None:
    """Worker initializer: ignore Ctrl-C (the server stops its workers) and run below the server's priority."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(AttributeError, OSError):
        os.nice(niceness)


class Workers:
    """One single-process :class:`multiprocessing.pool.Pool` per role of :data:`ROLES` (``spawn`` processes,
    started on first use). ``run`` waits for a result; ``submit`` returns an ``AsyncResult``; ``close``
    terminates the processes (what they were computing is dropped)."""

    def __init__(self):
        self._ctx = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()
        self._pools: dict[str, multiprocessing.pool.Pool] = {}
        self.closed = False

    def submit(self, role: str, fn, *args, **kwargs) -> multiprocessing.pool.AsyncResult:
        """``fn(*args, **kwargs)`` in the process of ``role``."""
        if role not in ROLES:
            raise ValueError(f"role={role!r} is invalid: must be one of {', '.join(ROLES)}")
        with self._lock:
            if self.closed:
                raise RuntimeError("the page's worker processes are stopped")
            if role not in self._pools:
                self._pools[role] = self._ctx.Pool(1, initializer=_worker_init, initargs=(ROLES[role],))
            return self._pools[role].apply_async(fn, args, kwargs)

    def run(self, role: str, fn, *args, timeout: float, **kwargs):
        """``fn(*args, **kwargs)`` in the process of ``role``, waited for at most ``timeout`` seconds
        (``multiprocessing.TimeoutError`` after); its exceptions are raised here."""
        return self.submit(role, fn, *args, **kwargs).get(timeout)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.terminate()
            pool.join()


@dataclass
class Job:
    """A background computation of the page: ``kind`` ("advise" or "simulate"), the knobs and parameters
    it was started with, and its units of work ``calls`` (``(fn, args, kwargs)``), run one after the other
    in the jobs process by a thread of the server (progress = units done)."""

    id: str
    kind: str
    knobs: dict
    params: dict
    calls: list[tuple]
    results: list = field(default_factory=list)
    error: str | None = None
    cancelled: bool = False
    finished: bool = False
    started: float = field(default_factory=time.monotonic)

    def run(self, workers: Workers) -> None:
        """Run the units until the end, the first error or a cancel (the unit running then still finishes)."""
        try:
            for fn, args, kwargs in self.calls:
                if self.cancelled:
                    break
                pending = workers.submit("jobs", fn, *args, **kwargs)
                while not pending.ready():
                    if workers.closed:
                        return
                    pending.wait(0.1)
                self.results.append(pending.get())
        except Exception as exc:  # noqa: BLE001 - reported to the page as one line
            self.error = one_line(exc)
        finally:
            self.finished = True

    def cancel(self) -> None:
        """Run no further unit."""
        self.cancelled = True

    def status(self) -> dict:
        """``id, kind, state`` (running, done, cancelled, error), ``done``/``total`` units, ``results``
        (finished units, in order), ``error`` (one line or ``None``), ``elapsed`` seconds, ``knobs``, ``params``."""
        results = list(self.results)
        if self.error is not None:
            state = "error"
        elif not self.finished:
            state = "running"
        else:
            state = "done" if len(results) == len(self.calls) else "cancelled"
        return {"id": self.id, "kind": self.kind, "state": state, "done": len(results), "total": len(self.calls),
                "results": results, "error": self.error, "elapsed": time.monotonic() - self.started,
                "knobs": self.knobs, "params": self.params}


class JobTable:
    """The page's jobs by id (the last ``keep``); starting a job cancels the unfinished one of the same kind."""

    def __init__(self, workers: Workers, *, keep: int = 16):
        self._workers = workers
        self._keep = keep
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def start(self, kind: str, *, knobs: dict, params: dict, calls: list[tuple]) -> Job:
        """Start a job of ``kind`` with one unit per ``(fn, args, kwargs)`` of ``calls``."""
        with self._lock:
            for job in self._jobs.values():
                if job.kind == kind:
                    job.cancel()
            job = Job(id=f"{kind}-{next(self._ids)}", kind=kind, knobs=knobs, params=params, calls=calls)
            self._jobs[job.id] = job
            while len(self._jobs) > self._keep:
                self._jobs.popitem(last=False)
        threading.Thread(target=job.run, args=(self._workers,), name=f"ftlab-explore-{job.id}", daemon=True).start()
        return job

    def get(self, job_id: str) -> Job:
        """The job ``job_id`` (``ValueError`` naming it when unknown or forgotten)."""
        with self._lock:
            if job_id not in self._jobs:
                raise ValueError(f"job={job_id!r} is unknown (only the last {self._keep} jobs are kept)")
            return self._jobs[job_id]
