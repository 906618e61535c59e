"""Self-describing, atomic result I/O.

* :func:`atomic_write_bytes` / :func:`atomic_write_text`: write to a temporary file in the same
  folder, fsync, then ``os.replace`` -- a reader never sees a half-written file and an interrupted
  write leaves the previous version intact.
* :func:`save_table`: a tidy :class:`pandas.DataFrame` as CSV (or Parquet, by extension) plus a
  JSON sidecar ``<file>.meta.json`` holding the parameters, the ftlab version, the seed and the
  time of writing.
* :func:`save_json` / :func:`load_table`.
* :func:`output_lock`: one run at a time per output folder (a lock file beside it; a second run on
  the same folder is refused with a clear message, never interleaved).
* :func:`staged_output`: all-or-nothing outputs of one command -- files are written into a staging
  folder beside the target and moved into place only when the command succeeded, so a failed run
  (full disk, error, interrupt) leaves no partial set and never damages a previous complete one.

Files are created with the user's umask (like ``open``), not the private 0600 of temporary files.
An ``OSError`` while writing names the target path (not the temporary file).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import io
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["atomic_write_bytes", "atomic_write_text", "ensure_dir", "file_mode", "load_table", "output_lock", "save_json",
           "save_table", "staged_output", "to_jsonable"]


def file_mode() -> int:
    """``0o666`` minus the process umask: the mode ``open()`` would give a new file."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def ensure_dir(path: Path) -> Path:
    """``mkdir -p path``; a path component that is a file gives a ``NotADirectoryError`` naming that file."""
    for parent in [*reversed(path.parents), path]:
        if parent.exists() and not parent.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "Not a directory (a file is in the way)", str(parent))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _named(exc: OSError, path: Path) -> OSError:
    """The same error, naming ``path`` instead of a temporary file."""
    return type(exc)(exc.errno, exc.strerror or str(exc), str(path)) if exc.errno is not None else exc


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file + fsync + rename). Creates parent folders.

    The file gets the user's umask mode; on failure (e.g. a full disk) the previous version of
    ``path`` is untouched, the temporary file is removed and the ``OSError`` names ``path``.
    """
    path = Path(path)
    tmp = None
    try:
        ensure_dir(path.parent)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        raise _named(exc, path) from None
    except BaseException:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def to_jsonable(obj: Any) -> Any:
    """Convert numpy scalars/arrays, paths and dataclasses into plain JSON types."""
    import dataclasses

    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return to_jsonable(dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        v = float(obj)
        return v if np.isfinite(v) else None
    if isinstance(obj, float):
        return obj if np.isfinite(obj) else None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def save_json(path: str | os.PathLike, obj: Any) -> Path:
    """Atomically write ``obj`` as indented JSON (numpy types converted)."""
    return atomic_write_text(path, json.dumps(to_jsonable(obj), indent=2, sort_keys=False) + "\n")


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".meta.json")


def save_table(df, path: str | os.PathLike, *, params: dict | None = None, seed: int | None = None) -> Path:
    """Save a DataFrame as CSV or Parquet (by suffix) with a JSON sidecar of its provenance."""
    from ftlab import __version__

    path = Path(path)
    if path.suffix == ".parquet":
        buf = io.BytesIO()
        df.to_parquet(buf, index=False)
        atomic_write_bytes(path, buf.getvalue())
    elif path.suffix == ".csv":
        atomic_write_text(path, df.to_csv(index=False))
    else:
        raise ValueError(f"path={str(path)!r} has an unsupported suffix: use .csv or .parquet")
    meta = {
        "ftlab_version": __version__,
        "written": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "seed": seed,
        "rows": int(len(df)),
        "columns": list(map(str, df.columns)),
        "params": params or {},
    }
    save_json(_sidecar(path), meta)
    return path


def load_table(path: str | os.PathLike):
    """Load a table written by :func:`save_table`; returns ``(df, meta)`` (meta is ``{}`` if absent)."""
    import pandas as pd

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"results table {str(path)!r} does not exist")
    df = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    side = _sidecar(path)
    meta = json.loads(side.read_text()) if side.exists() else {}
    return df, meta


@contextlib.contextmanager
def output_lock(out: str | os.PathLike) -> Iterator[Path]:
    """Hold an exclusive lock on the output folder ``out`` while the block runs.

    The lock is the file ``.<name>.lock`` beside ``out`` (``flock``, released when the process
    ends, even by SIGKILL). A second run on the same ``out`` raises ``ValueError`` naming the
    folder and the holder's pid.
    """
    import fcntl

    out = Path(out)
    lock = out.parent / f".{out.name}.lock"
    try:
        ensure_dir(out.parent)
        fh = open(lock, "a+")  # noqa: SIM115 - held for the whole block
    except NotADirectoryError:
        raise
    except OSError as exc:
        raise _named(exc, out) from None
    try:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "?"
            raise ValueError(f"--out {str(out)!r} is in use by another ftlab run (pid {holder}, lock {str(lock)!r}): "
                             "wait for it to finish or choose another --out") from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        yield out
    finally:
        fh.close()


@contextlib.contextmanager
def staged_output(out: str | os.PathLike) -> Iterator[Path]:
    """Yield a staging folder; on success move everything written there into ``out``.

    The staging folder ``.<name>.staging-<pid>`` sits beside ``out`` (same filesystem), so the
    final moves are renames that cannot run out of space. On any exception the staging folder is
    deleted and ``out`` is left exactly as it was.
    """
    out = Path(out)
    stage = out.parent / f".{out.name}.staging-{os.getpid()}"
    try:
        if out.exists() and not out.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "Not a directory", str(out))
        ensure_dir(out.parent)
        if stage.exists():
            shutil.rmtree(stage)
        stage.mkdir()
    except NotADirectoryError:
        raise
    except OSError as exc:
        raise _named(exc, out) from None
    try:
        yield stage
        try:
            ensure_dir(out)
            for src in sorted(stage.rglob("*")):
                dst = out / src.relative_to(stage)
                if src.is_dir():
                    dst.mkdir(exist_ok=True)
                else:
                    os.replace(src, dst)
        except OSError as exc:
            raise _named(exc, out) from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)
