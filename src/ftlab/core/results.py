"""Self-describing, atomic result I/O.

* :func:`atomic_write_bytes` / :func:`atomic_write_text`: write to a temporary file in the same
  folder, fsync, then ``os.replace`` -- a reader never sees a half-written file and an interrupted
  write leaves the previous version intact.
* :func:`save_table`: a tidy :class:`pandas.DataFrame` as CSV (or Parquet, by extension) plus a
  JSON sidecar ``<file>.meta.json`` holding the parameters, the ftlab version, the seed and the
  time of writing.
* :func:`save_json` / :func:`load_table` (which can require columns and numbers, naming the file).
* :func:`check_output_place`: an output folder that is, contains or lies inside an input is refused.
* :func:`output_lock`: one run at a time per output folder, by the folder's identity (the lock file
  is inside the resolved folder; a second run is refused with a clear message, never interleaved).
* :func:`staged_output`: whole-or-nothing output *sets* -- files are written into a staging folder
  inside the output folder and replace the previous set of the same name as one unit (journaled,
  completed by the next lock after a kill), so a failed, interrupted or killed run never leaves a
  mix of old and new files, and a set's stale files do not survive beside a new one.
* :func:`confined_path`: a file name read from an untrusted file, kept inside its folder.

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
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

__all__ = ["atomic_write_bytes", "atomic_write_text", "check_output_place", "confined_path", "ensure_dir", "file_mode",
           "load_table", "output_lock", "output_outcomes", "save_json", "save_table", "staged_output", "to_jsonable"]


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


def load_table(path: str | os.PathLike, *, columns: tuple[str, ...] = (), numeric: tuple[str, ...] = ()):
    """Load a table written by :func:`save_table`; returns ``(df, meta)`` (meta is ``{}`` if absent).

    ``columns``: names the table must have; ``numeric``: those of them that must hold numbers. A file
    that is not a readable table, a missing or non-numeric column and a sidecar that is not a JSON
    object are each a ``ValueError`` naming the file and the column or field.
    """
    import pandas as pd

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"results table {str(path)!r} does not exist")
    try:
        df = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    except ValueError as exc:  # pandas' and pyarrow's parse errors, undecodable bytes
        raise ValueError(f"{path}: not a readable table ({_first_line(exc)})") from None
    for col in columns:
        if col not in df.columns:
            raise ValueError(f"{path}: column {col!r} is missing (columns: {', '.join(map(str, df.columns))})")
    check_numeric(df, numeric, path)
    return df, _read_meta(_sidecar(path))


def check_numeric(df, columns, path) -> None:
    """A ``ValueError`` naming ``path`` and the column when one of ``columns`` of ``df`` holds a value that is
    not a number (missing values are allowed)."""
    import pandas as pd

    for col in columns:
        values = pd.to_numeric(df[col], errors="coerce")
        bad = df[col][values.isna() & df[col].notna()]
        if len(bad):
            raise ValueError(f"{path}: column {col!r} holds a value that is not a number ({bad.iloc[0]!r})")


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def read_json_object(path: str | os.PathLike, *, role: str = "", hint: str = "") -> dict:
    """The JSON object stored in ``path`` (a file ftlab reads but does not trust: configs, sidecars,
    manifests). A file that cannot be read, is not UTF-8 JSON or holds something other than an object
    raises a one-line ``ValueError`` naming it (prefixed by ``role``, e.g. ``"target base"``, and
    followed by ``hint``, e.g. ``"delete it"``)."""
    head = f"{role}: {path}" if role else f"{path}"
    tail = f": {hint}" if hint else ""
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{head}: not valid JSON ({_first_line(exc)}){tail}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{head}: expected a JSON object, got {type(obj).__name__}{tail}")
    return obj


def _read_meta(side: Path) -> dict:
    """A table's sidecar as a dict (``{}`` if there is none); ``ValueError`` naming the file otherwise."""
    if not side.exists():
        return {}
    meta = read_json_object(side)
    if not isinstance(meta.get("params", {}), dict):
        raise ValueError(f"{side}: field 'params' must be a JSON object, got {type(meta['params']).__name__}")
    return meta


# --------------------------------------------------------------------------------------------------
# Output places: inputs kept safe, one run per folder, output sets replaced whole.
#
# Everything ftlab keeps in an output folder ``out`` lives inside ``out`` itself (so a mount point, a
# symlink to another filesystem or a writable folder under a read-only parent works):
#   .ftlab.lock                 the lock (flock), removed when the run ends
#   .ftlab-set-<name>.json      the manifest of an output set: the files it consists of
#   .ftlab-stage-<pid>-<hex>/   a set being written
#   .ftlab-commit-<name>/       a set being put in place (the journal of a commit)
#   .ftlab-trash-<pid>-<hex>/   a finished commit's leftovers (the replaced files), being deleted
# --------------------------------------------------------------------------------------------------

_LOCK = ".ftlab.lock"
_STAGE = ".ftlab-stage-"
_COMMIT = ".ftlab-commit-"
_TRASH = ".ftlab-trash-"
_SET = ".ftlab-set-"
_RESERVED = ".ftlab"
_PLAN = ".ftlab-plan.json"  # inside a commit folder, beside the set's files: reserved names cannot collide
_OLD = ".ftlab-replaced"
_SET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")

#: Resolved output folders whose lock this process holds (path -> lock file descriptor).
_HELD: dict[str, int] = {}
#: What happened to the output sets of this process: "<out>: ..." sentences (read by the CLI on an interrupt).
_OUTCOMES: list[str] = []


def output_outcomes() -> list[str]:
    """One sentence per output set this process finished or discarded, e.g. for the message after an interrupt."""
    return list(_OUTCOMES)


def _fid(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def check_output_place(out: str | os.PathLike, inputs: dict[str, Any]) -> Path:
    """Refuse an output folder that is, contains or lies inside one of the run's inputs.

    ``inputs`` maps a name (e.g. ``"--target-base"``) to a path (``None`` entries are skipped).
    Paths are compared after resolving symlinks, and by device and inode where they exist (so a
    bind mount or a second spelling is recognised). Raises ``ValueError`` naming the input; returns
    the resolved output folder. Call it before any work.
    """
    place = Path(os.path.realpath(os.fspath(out)))
    place_id = _fid(place)
    above = {i for i in map(_fid, place.parents) if i is not None}
    for label, raw in inputs.items():
        if raw is None:
            continue
        path = Path(os.path.realpath(os.fspath(raw)))
        pid = _fid(path)
        if path == place or (pid is not None and pid == place_id):
            how = "is"
        elif place in path.parents or (place_id is not None and place_id in map(_fid, path.parents)):
            how = "contains"
        elif path in place.parents or (pid is not None and pid in above):
            how = "lies inside"
        else:
            continue
        raise ValueError(f"output folder {str(out)!r} {how} the input {label} {str(raw)!r}: ftlab never writes "
                         "where its inputs are; choose another output folder")
    return place


def confined_path(folder: str | os.PathLike, name: object, *, source: str, follow: bool = True) -> Path:
    """``folder / name`` for a file name read from an untrusted file (``source`` names it and the field).

    Refused with ``ValueError``: a name that is not a non-empty string, an absolute path, a ``..``
    part, or a path whose resolved location (through symlinks; the last part only with ``follow``)
    lies outside the resolved ``folder``.
    """
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ValueError(f"{source}: {name!r} is not a file name")
    pure = PurePosixPath(name)
    if pure.is_absolute() or ".." in pure.parts or re.match(r"^[A-Za-z]:[\\/]|^[\\/]", name):
        raise ValueError(f"{source}: {name!r} points outside its folder {str(folder)!r}")
    base = os.path.realpath(folder)
    path = Path(folder) / name
    where = os.path.realpath(path) if follow else os.path.join(os.path.realpath(path.parent), path.name)
    if os.path.commonpath([base, where]) != base:
        raise ValueError(f"{source}: {name!r} points outside its folder {str(folder)!r} (to {where!r})")
    return path


def _make_folder(out: Path, place: Path) -> list[Path]:
    """Create ``place`` (the resolved ``out``) and missing parents; return what was created."""
    if place.exists():
        if not place.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "Not a directory", str(out))
        return []
    missing = []
    p = place
    while not os.path.lexists(p):
        missing.append(p)
        p = p.parent
    if not p.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "Not a directory (a file is in the way)", str(p))
    created: list[Path] = []
    for d in reversed(missing):
        try:
            os.mkdir(d)
        except FileExistsError:
            continue
        except OSError as exc:
            _remove_empty(created)
            raise OSError(exc.errno, f"{exc.strerror} (creating the output folder in {str(d.parent)!r})",
                          str(out)) from None
        created.append(d)
    return created


def _remove_empty(folders: list[Path]) -> None:
    for d in reversed(folders):
        try:
            os.rmdir(d)
        except OSError:
            return


def _lock_fd(fd: int, lock: Path, place: Path, out: Path) -> bool:
    """``flock`` the open lock file ``fd`` and write our pid; ``False`` if ``lock`` no longer names that file."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        raise ValueError(f"output folder {str(out)!r} is in use by another ftlab run (pid {holder}, folder "
                         f"{str(place)!r}): wait for it to finish or choose another output folder") from None
    except OSError as exc:
        raise OSError(exc.errno, f"{exc.strerror} (locking the output folder)", str(out)) from None
    st = os.fstat(fd)
    if _fid(lock) != (st.st_dev, st.st_ino):
        return False
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
    except OSError as exc:  # e.g. a full disk: the file is ours (we hold its lock), so it goes, with its folder if new
        with contextlib.suppress(OSError):
            os.unlink(lock)
        raise _named(exc, lock) from None
    return True


def _acquire(place: Path, out: Path) -> int:
    """An exclusive ``flock`` on ``place/.ftlab.lock``; ``ValueError`` naming the holder if another run has it."""
    lock = place / _LOCK
    for _ in range(100):
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, file_mode())
        except OSError as exc:
            raise OSError(exc.errno, f"{exc.strerror} (the output folder must be writable)", str(out)) from None
        try:
            if _lock_fd(fd, lock, place, out):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the previous holder removed that lock file between our open and flock: take the new one
    raise RuntimeError(f"could not take the lock of {str(place)!r}: it was replaced 100 times")


@contextlib.contextmanager
def output_lock(out: str | os.PathLike) -> Iterator[Path]:
    """Hold the exclusive lock of the output folder ``out`` while the block runs; yield its resolved path.

    The lock goes by the folder's identity: ``out`` is resolved through symlinks and the lock is the
    file ``.ftlab.lock`` inside it (``flock``, released by the kernel even after SIGKILL). A second run
    on the same folder, however it is spelled, raises ``ValueError`` naming the holder's pid. Missing
    folders are created (a folder that cannot be created, or is not writable, is an ``OSError`` naming
    the cause, before any work); on every exit path the lock file is removed and folders this call
    created are removed again if they are empty (nothing is left behind by a refused run). Taking the
    lock completes an output set that a killed run was putting in place and deletes stale staging
    folders, so the folder holds complete sets only.
    """
    out = Path(out)
    place = Path(os.path.realpath(out))
    created = _make_folder(out, place)
    fd = None
    try:
        fd = _acquire(place, out)  # a second lock in the same process is refused like another process's
        _HELD[str(place)] = fd
        _recover(place)
        yield place
    finally:
        if fd is not None:
            _HELD.pop(str(place), None)
            with contextlib.suppress(OSError):
                os.unlink(place / _LOCK)  # before closing: a run waiting on this file sees it replaced
            os.close(fd)
        _remove_empty(created)


def _recover(place: Path) -> None:
    """Finish what killed runs left in ``place``: complete commits, delete staging and trash folders."""
    with os.scandir(place) as it:
        entries = sorted(e.name for e in it if e.name.startswith(_RESERVED))
    for name in entries:
        if name.startswith(_COMMIT):
            commit = place / name
            try:
                _apply(place, commit, _read_plan(commit), None)
            except OSError as exc:
                raise OSError(exc.errno, f"{exc.strerror} (putting in place the output an earlier run left in "
                              f"{name})", str(place)) from None
            _dispose(place, commit)
    for name in entries:
        if name.startswith((_STAGE, _TRASH)):
            shutil.rmtree(place / name, ignore_errors=True)
        elif name.startswith(_SET) and name.endswith(".json"):
            _manifest_files(place / name)  # a damaged manifest is refused now, before any work


def _name_list(obj: dict, field: str, path: Path, folder: Path, what: str) -> list[str]:
    names = obj.get(field)
    if not isinstance(names, list):
        raise ValueError(f"{path}: field {field!r} of the {what} is not a list: delete it")
    for n in names:
        confined_path(folder, n, source=f"{path}, field {field!r}", follow=False)
        if str(n).startswith(_RESERVED) and not str(n).startswith(_SET):
            raise ValueError(f"{path}: field {field!r} names ftlab's own file {n!r}: delete it")
    return names


def _manifest_files(manifest: Path) -> list[str]:
    """The files of the output set described by ``manifest`` (``[]`` if it does not exist)."""
    if not os.path.lexists(manifest):
        return []
    obj = read_json_object(manifest, role="ftlab output manifest", hint="delete it")
    return _name_list(obj, "files", manifest, manifest.parent, "ftlab output manifest")


def _read_plan(commit: Path) -> dict:
    path = commit / _PLAN
    plan = read_json_object(path, role="ftlab commit plan", hint="delete it")
    return {f: _name_list(plan, f, path, commit.parent, "ftlab commit plan") for f in ("files", "remove")}


def _apply(place: Path, commit: Path, plan: dict, done: list | None) -> None:
    """Put the set held in ``commit`` in place (idempotent: completes a commit a kill interrupted).

    Each file of the set replaces its namesake (which is kept in ``commit/replaced``), then the
    previous set's files that the new one lacks are moved there too. ``done`` records every rename.
    """
    old = commit / _OLD

    def move(src: Path, dst: Path) -> None:
        if not dst.parent.is_dir():
            dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dst)
        if done is not None:
            done.append((src, dst))

    for rel in plan["files"]:
        if not os.path.lexists(commit / rel):
            continue  # already in place
        if os.path.lexists(place / rel):
            move(place / rel, old / rel)
        move(commit / rel, place / rel)
    for rel in plan["remove"]:
        if os.path.lexists(place / rel) and rel not in plan["files"]:
            move(place / rel, old / rel)


def _dispose(place: Path, folder: Path) -> None:
    """Delete a finished commit or a stage: renamed to a trash name first (a kill during the deletion
    leaves nothing that looks like a pending commit), then removed; leftovers go at the next lock."""
    trash = place / f"{_TRASH}{os.getpid()}-{secrets.token_hex(4)}"
    try:
        os.rename(folder, trash)
    except OSError:
        trash = folder
    shutil.rmtree(trash, ignore_errors=True)


def _fsync_path(path: Path, *, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _stage_files(stage: Path) -> list[str]:
    """Relative paths of the files written into ``stage`` (fsynced here, with their folders)."""
    files = []
    for root, _dirs, names in os.walk(stage):
        for n in names:
            p = Path(root) / n
            rel = p.relative_to(stage).as_posix()
            if rel.startswith(_RESERVED):
                raise RuntimeError(f"{rel!r}: names starting with {_RESERVED!r} are ftlab's own")
            if not p.is_symlink():
                _fsync_path(p)
            files.append(rel)
        _fsync_path(Path(root), directory=True)
    return sorted(files)


@contextlib.contextmanager
def _deferred_signals() -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP back while the block runs (main thread only); deliver them after."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    saved = {}
    for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None and signal.getsignal(sig) not in (signal.SIG_IGN, None):
            saved[sig] = signal.signal(sig, lambda n, _f: pending.append(n))
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        if pending:
            signal.raise_signal(pending[0])


def _commit(place: Path, stage: Path, name: str, state: dict) -> None:
    """Replace the set ``name`` in ``place`` by the files in ``stage``, as one unit.

    The stage (files, the new manifest and the plan) is made durable, then renamed to the commit
    folder: that rename is the commit point. Before it, the old set stands; after it, the new one
    does -- the renames that follow are done here, or by the next lock on ``place`` if this process is
    killed. An error during them (e.g. a full disk) undoes them, so the old set stands again.
    ``state["phase"]`` says how far it got: ``"done"``, or ``"pending"`` when the undo failed too.
    """
    files = _stage_files(stage)
    manifest = f"{_SET}{name}.json"
    remove = sorted(set(_manifest_files(place / manifest)) - set(files))
    from ftlab import __version__

    atomic_write_text(stage / manifest, json.dumps({"ftlab_output_set": name, "ftlab_version": __version__, "written":
                      _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "files": files}, indent=1))
    plan = {"files": [*files, manifest], "remove": remove}
    atomic_write_text(stage / _PLAN, json.dumps(plan))
    _fsync_path(stage, directory=True)
    for rel in files:
        (place / rel).parent.mkdir(parents=True, exist_ok=True)
    commit = place / f"{_COMMIT}{name}"
    done: list[tuple[Path, Path]] = []
    with _deferred_signals():
        os.rename(stage, commit)
        try:
            _fsync_path(place, directory=True)
            _apply(place, commit, plan, done)
            _fsync_path(place, directory=True)
        except OSError as exc:
            state["phase"] = "undoing"
            _undo(place, commit, done, state)
            raise _named(exc, place) from None
        state["phase"] = "done"
        _dispose(place, commit)


def _undo(place: Path, commit: Path, done: list[tuple[Path, Path]], state: dict) -> None:
    """Reverse the renames of a failed commit and drop it; if that fails too, the commit stays for the next lock."""
    undone = place / f"{_STAGE}{os.getpid()}-{secrets.token_hex(4)}"
    try:
        for src, dst in reversed(done):
            os.replace(dst, src)
        os.rename(commit, undone)
    except OSError:
        state["phase"] = "pending"
        return
    _dispose(place, undone)


@contextlib.contextmanager
def staged_output(out: str | os.PathLike, *, name: str = "output") -> Iterator[Path]:
    """Yield a staging folder; when the block succeeds, its files replace the output set ``name`` of ``out``.

    Whole or nothing: the new set is written into a staging folder inside ``out`` (same filesystem)
    and replaces the previous set of the same name as one unit (:func:`_commit`); the previous set's
    files that the new one lacks are removed, other files in ``out`` stay. On an error, an
    interrupt or SIGTERM (the CLI turns it into an exception) the staging folder is deleted and the
    previous set is untouched; after SIGKILL the next lock on ``out`` finishes or discards what was
    left, so a complete old or a complete new set is all the next run sees. ``name`` (letters,
    digits, ``_.-``) tells sets apart that share a folder. Takes :func:`output_lock` unless this
    process holds it already.
    """
    if not isinstance(name, str) or not _SET_NAME.fullmatch(name):
        raise RuntimeError(f"staged_output: name={name!r} must be letters, digits, '_', '.' or '-'")
    out = Path(out)
    place = Path(os.path.realpath(out))
    with contextlib.ExitStack() as held:
        if str(place) not in _HELD:
            held.enter_context(output_lock(out))
        stage = place / f"{_STAGE}{os.getpid()}-{secrets.token_hex(4)}"
        try:
            os.mkdir(stage)
        except OSError as exc:
            raise _named(exc, out) from None
        state = {"phase": "writing"}
        try:
            yield stage
            _commit(place, stage, name, state)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            _OUTCOMES.append(f"{out}: " + _PHASE_OUTCOME.get(state["phase"], _PHASE_OUTCOME["writing"]))
            raise
        _OUTCOMES.append(f"{out}: " + _PHASE_OUTCOME["done"])


_PHASE_OUTCOME = {
    "writing": "the unfinished output was discarded; the previous one is unchanged",
    "done": "the new output is complete",
    "pending": "the new output is complete but not yet in place; the next ftlab run on this folder puts it in place",
}
