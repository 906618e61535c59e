"""Registries filled by their own folder: every module of a package imported once, in name order.

A registry whose entries each live in one module (the layer kinds of ``ftlab.transfer.kinds``, the
methods of ``ftlab.transfer.methods``) imports its package's modules with :func:`import_submodules`,
so adding an entry is adding one module (and its test), with no list elsewhere to extend.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable

__all__ = ["import_submodules"]


def import_submodules(package: str, path: Iterable[str], *, skip: Iterable[str] = ()) -> list[str]:
    """Import every module directly inside ``package`` (its ``__path__`` is ``path``) except ``skip``, sorted by
    name; returns their full names. Sub-packages and modules whose name starts with ``_`` are left out."""
    left_out = set(skip)
    names = sorted(m.name for m in pkgutil.iter_modules(list(path))
                   if not m.ispkg and not m.name.startswith("_") and m.name not in left_out)
    return [importlib.import_module(f"{package}.{n}").__name__ for n in names]
