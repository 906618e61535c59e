"""The user's own code: importing it by name, and telling its errors from ftlab's.

* :func:`load_callable` imports ``module:function`` or ``path/to/file.py:function``. Module names
  are looked up on Python's path and then in the current folder (appended last, so it never
  shadows an installed module; a console script does not put the current folder on the path by
  itself). A module that cannot be found is a ``ValueError`` with a hint; a module whose own code
  fails on import is a :class:`UserCodeError` naming it.
* :class:`blame` wraps a call into the user's code (a model, a loss, a data factory): an exception
  raised there becomes a :class:`UserCodeError` whose one line names what was called, e.g.
  ``target model, calibration batch 0: RuntimeError: mat1 and mat2 shapes cannot be multiplied``.
  Two cases are left alone, as defects of ftlab: an exception raised by ftlab's own code, and one
  raised inside ftlab code that a library called back (a hook ftlab put into the model). ftlab code
  that only passes the call on (an adapter such as "the model's own loss") does not make an error
  of the model ftlab's.
* :func:`culprit` says whose code raised an exception: ``"user"``, ``"ftlab"`` or ``"library"``.
* :func:`check_callable` / :func:`check_model`: the Python API's first check of a user's function or
  model, naming the argument: a ``TypeError`` for the wrong kind of object (a string where a loss
  function belongs), a ``ValueError`` for a model whose weights are on the meta device.

Frames count as *library* when their file lies in the standard library or in ``site-packages``
(torch, transformers, ...), and so do ftlab's reference models (``ftlab.models``), which are
models like any other; everything else outside ftlab is the user's.
"""

from __future__ import annotations

import errno
import importlib
import importlib.util
import os
import sys
import sysconfig
import traceback
from pathlib import Path
from types import TracebackType
from typing import Literal

__all__ = ["UserCodeError", "blame", "check_callable", "check_model", "culprit", "describe", "load_callable"]

_FTLAB = os.path.realpath(Path(__file__).resolve().parents[1])
_MODELS = os.path.join(_FTLAB, "models")
_LIBRARIES = tuple(sorted({os.path.realpath(p) for k, p in sysconfig.get_paths().items()
                           if k in ("stdlib", "platstdlib", "purelib", "platlib")}))


class UserCodeError(ValueError):
    """An error raised by the user's own code (model, loss, data, module), in one line naming where."""


def _kind(filename: str) -> str:
    if filename.startswith("<"):
        return "user" if filename in ("<string>", "<stdin>") else "library"  # <frozen importlib...> is Python's
    path = os.path.realpath(filename)
    if path.startswith(_FTLAB + os.sep):
        return "library" if path.startswith(_MODELS + os.sep) else "ftlab"
    parts = Path(path).parts
    if "site-packages" in parts or "dist-packages" in parts or path.startswith(_LIBRARIES):
        return "library"
    return "user"


def culprit(exc: BaseException, *, skip: int = 0) -> tuple[str, traceback.FrameSummary | None]:
    """Whose code raised ``exc``: the innermost frame of its traceback (after the first ``skip``) that is
    not in an installed library decides -- ``("user", frame)`` or ``("ftlab", frame)``; ``("library",
    None)`` when every frame is a library's."""
    frames = traceback.extract_tb(exc.__traceback__)[skip:]
    for frame in reversed(frames):
        kind = _kind(frame.filename)
        if kind != "library":
            return kind, frame
    return "library", None


def describe(exc: BaseException, frame: traceback.FrameSummary | None = None) -> str:
    """``Type: first line of the message`` and, for a frame of the user's, ``(file:line, in function)``."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0] if lines else '(no message)'}"
    if frame is not None and _kind(frame.filename) == "user":
        text += f" (at {frame.filename}:{frame.lineno}, in {frame.name})"
    return text


class blame:
    """``with blame("target model, calibration batch 0"): model(batch)`` -- see the module docstring.

    ``MemoryError`` and exceptions that are not ``Exception`` (Ctrl-C) pass unchanged, and so does a
    :class:`UserCodeError` raised inside (it already names its input).
    """

    def __init__(self, what: str):
        self.what = what

    def __enter__(self) -> blame:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        if exc is None or not isinstance(exc, Exception) or isinstance(exc, (UserCodeError, MemoryError)):
            return False
        frames = traceback.extract_tb(tb)[1:]  # below the frame running the with statement
        kinds = [_kind(f.filename) for f in frames]
        if not kinds or kinds[-1] == "ftlab":
            return False  # raised by ftlab's own code
        if any(k == "ftlab" and i > 0 and kinds[i - 1] == "library" for i, k in enumerate(kinds)):
            return False  # raised inside ftlab code a library called back (a hook)
        user = [f for f, k in zip(frames, kinds) if k == "user"]
        raise UserCodeError(f"{self.what}: {describe(exc, user[-1] if user else None)}") from exc


def _import_file(path: Path, what: str):
    if not path.is_file():
        raise FileNotFoundError(errno.ENOENT, f"{what}: no such Python file", str(path))
    spec = importlib.util.spec_from_file_location(f"_ftlab_user_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{what}: cannot load {str(path)!r} as a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the file's own code failed: the user's error, named
        raise UserCodeError(f"{what}: importing {str(path)!r} failed: {describe(exc, culprit(exc)[1])}") from exc
    return module


def _import_module(name: str, what: str, attr: str):
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (name == exc.name or name.startswith(exc.name + ".")):
            raise UserCodeError(f"{what}: importing {name!r} failed: {describe(exc, culprit(exc)[1])}") from exc
        hint = f"{name.replace('.', '/')}.py:{attr}"
        raise ValueError(f"{what}: cannot import {name!r}: no module {exc.name!r} on Python's path or in the current "
                         f"folder {cwd!r}; give the file instead, e.g. path/to/{hint}") from None
    except Exception as exc:  # noqa: BLE001 - the module's own code failed on import
        raise UserCodeError(f"{what}: importing {name!r} failed: {describe(exc, culprit(exc)[1])}") from exc


def load_callable(ref: str, what: str):
    """``module:function`` or ``path/to/file.py:function`` -> the callable (see the module docstring).

    ``what`` names the option or argument in every error, e.g. ``"--loss"``.
    """
    if not isinstance(ref, str) or ":" not in ref:
        raise ValueError(f"{what}={ref!r} is invalid: expected module:function or file.py:function")
    mod_name, _, attr = ref.rpartition(":")
    if not mod_name or not attr:
        raise ValueError(f"{what}={ref!r} is invalid: expected module:function or file.py:function")
    if mod_name.endswith(".py"):
        module = _import_file(Path(mod_name), what)
    else:
        module = _import_module(mod_name, what, attr)
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"{what}: {mod_name!r} has no callable {attr!r}")
    return fn


def check_callable(name: str, value):
    """Require a callable (e.g. ``loss(model, batch)``); ``TypeError`` naming the argument otherwise."""
    if not callable(value):
        hint = " (a module:function string is read by the ftlab command, not by the Python API)" \
            if isinstance(value, str) else ""
        raise TypeError(f"{name}={value!r} is not callable: give a function{hint}")
    return value


def check_model(name: str, model):
    """Require a ``torch.nn.Module`` (else ``TypeError``) whose parameters and buffers hold values (else
    ``ValueError``: one on the meta device), naming the argument."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{name} must be a torch.nn.Module, got {type(model).__name__}")
    for key, t in [*model.named_parameters(), *model.named_buffers()]:
        if t.is_meta:
            raise ValueError(f"{name}: {key!r} is on the meta device (it has no values): load the model's weights "
                             "first, e.g. model.load_state_dict(state, assign=True)")
    return model
