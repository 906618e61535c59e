"""Choosing the scaling coefficient alpha: the same protocol for every method.

Task-arithmetic papers pick ``alpha`` in ``theta = theta_pre + alpha * tau`` on held-out
validation data (Ilharco et al. 2023). :func:`search_alpha` evaluates a user score on a grid and
returns the best coefficient and the whole table; :data:`DEFAULT_GRID` is ``0, 0.1, 0.2, ..., 3.0``
(a default chosen here, [U]; the reference BiCo configuration sweeps 0.8-10). It starts at 0, the target
left as it is, so a search can decline a transfer that does not help on validation, and ties go to the
smallest alpha: a transfer must beat the untouched target to be chosen. When the best alpha is an end of
the grid (0 or its largest value), the table says so (``at_edge``) and the grid may be too narrow. BiCo's
headline setting is reported to use no tuning, so also report ``alpha = 1``, which the default grid contains.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from ftlab.core.validate import check_finite

__all__ = ["DEFAULT_GRID", "search_alpha"]

DEFAULT_GRID: tuple[float, ...] = tuple(round(0.1 * i, 10) for i in range(0, 31))


def search_alpha(score_fn: Callable[[float], float], *, grid: Iterable[float] = DEFAULT_GRID,
                 higher_is_better: bool = True):
    """Evaluate ``score_fn(alpha)`` (a validation score) on ``grid``; return ``(best_alpha, table)``.

    ``table`` is a :class:`pandas.DataFrame` with columns ``alpha``, ``score`` and ``best``; its
    ``attrs["at_edge"]`` is True when the best alpha is the grid's smallest or largest value. Ties
    go to the smallest alpha. A non-finite score raises ``ValueError`` naming the alpha.

    Examples
    --------
    >>> best, table = search_alpha(lambda a: accuracy(tau_b.apply(base, a), val_loader))  # doctest: +SKIP
    """
    import pandas as pd

    alphas = [float(a) for a in grid]
    if not alphas:
        raise ValueError("grid is empty: give at least one alpha")
    check_finite("grid", np.asarray(alphas))
    if len(set(alphas)) != len(alphas):
        raise ValueError("grid has repeated alphas")
    alphas.sort()
    scores = []
    for a in alphas:
        s = float(score_fn(a))
        if not np.isfinite(s):
            raise ValueError(f"score_fn({a}) = {s} is not finite")
        scores.append(s)
    arr = np.asarray(scores)
    best = int(np.argmax(arr) if higher_is_better else np.argmin(arr))
    table = pd.DataFrame({"alpha": alphas, "score": scores, "best": [i == best for i in range(len(alphas))]})
    table.attrs["at_edge"] = len(alphas) > 1 and best in (0, len(alphas) - 1)
    return alphas[best], table
