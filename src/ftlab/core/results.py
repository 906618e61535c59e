"""Self-describing, atomic result I/O.

* :func:`atomic_write_bytes` / :func:`atomic_write_text`: write to a temporary file in the same
  folder, fsync, then ``os.replace`` -- a reader never sees a half-written file and an interrupted
  write leaves the previous version intact.
* :func:`save_table`: a tidy :class:`pandas.DataFrame` as CSV (or Parquet, by extension) plus a
  JSON sidecar ``<file>.meta.json`` holding the parameters, the ftlab version, the seed and the
  time of writing.
* :func:`save_json` / :func:`load_table`.
"""

from __future__ import annotations

import datetime as _dt
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["atomic_write_bytes", "atomic_write_text", "save_json", "save_table", "load_table", "to_jsonable"]


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file + fsync + rename). Creates parent folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
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
