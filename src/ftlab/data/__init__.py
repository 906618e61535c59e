"""Offline dataset loaders.

Only files that install without internet are read (see ``docs/data.md``); nothing is downloaded.
A missing dataset raises :class:`ftlab.data.DatasetMissing` (a ``FileNotFoundError``) whose
one-line message names the package that provides it.

* :mod:`ftlab.data.images` -- Fashion-MNIST, MNIST (IDX files), sklearn digits.
"""

from ftlab.data.images import (
    DatasetMissing,
    load_digits,
    load_fashion_mnist,
    load_mnist,
    read_idx,
)

__all__ = ["DatasetMissing", "read_idx", "load_fashion_mnist", "load_mnist", "load_digits"]
