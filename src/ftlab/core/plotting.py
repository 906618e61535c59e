"""Matplotlib helpers: a headless backend, a consistent look, atomic PNG writes.

Figures are always made from saved results (tables), never as a side effect of computing them.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

__all__ = ["new_figure", "save_figure"]


def new_figure(nrows: int = 1, ncols: int = 1, *, size: tuple[float, float] | None = None, **kw):
    """Return ``(fig, axes)`` on the headless Agg backend with ftlab's defaults."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    if size is None:
        size = (4.2 * ncols, 3.3 * nrows)
    fig, axes = plt.subplots(nrows, ncols, figsize=size, squeeze=kw.pop("squeeze", True), **kw)
    return fig, axes


def save_figure(fig, path: str | os.PathLike, *, dpi: int = 130) -> Path:
    """Write ``fig`` as PNG atomically and close it."""
    import matplotlib.pyplot as plt

    from ftlab.core.results import atomic_write_bytes

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return atomic_write_bytes(Path(path), buf.getvalue())
