"""The knobs of the page: one validated setting (init scales, evaluation magnitudes, task, sample ratio).

A page request carries its knobs as query parameters (strings); :func:`parse_knobs` turns them into
one :class:`Knobs`, validated by the library's own checks (:class:`~ftlab.dln.model.InitScales`,
:class:`~ftlab.dln.tasks.TaskSpec`), so that the page refuses exactly what the library refuses, with
the library's one-line message.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields

from ftlab.core.validate import check_positive
from ftlab.dln.model import InitScales
from ftlab.dln.regimes import MAX_BETA
from ftlab.dln.tasks import TaskSpec

__all__ = ["Knobs", "parse_knobs", "parse_number"]


@dataclass(frozen=True)
class Knobs:
    """One setting of the page (all floats; validated on construction).

    c : absolute PT init scale, in (0, 1e50]. lam : relative scale of the first layer, in [-1, 1].
    gamma : FT readout re-initialization scale, in [0, 1e50] (never ``lam = -1`` with ``gamma = 0``).
    beta_pt, beta_ft : the magnitudes ``|beta_PT|``, ``|beta_FT|`` of one coordinate at which the
        l-order, PD and the potential are evaluated (finite, at most 1e100 in absolute value).
    rho_pt, rho_ft : PT and FT teacher sparsities in [0, 1]. overlap : ``|S_PT ∩ S_FT| / |S_FT|``
        (feasible with the sparsities, see :class:`~ftlab.dln.tasks.TaskSpec`).
    alpha : FT samples per dimension ``N_FT / D`` (> 0).
    """

    c: float = 1e-3
    lam: float = -0.99
    gamma: float = 0.0
    beta_pt: float = 1.0
    beta_ft: float = 1.0
    rho_pt: float = 0.1
    rho_ft: float = 0.1
    overlap: float = 1.0
    alpha: float = 0.2

    def __post_init__(self):
        self.scales()  # the library's checks, with its one-line messages
        self.task()
        for name in ("beta_pt", "beta_ft"):
            value = getattr(self, name)
            if not math.isfinite(value) or abs(value) > MAX_BETA:
                raise ValueError(f"{name}={value!r} is out of range: must be finite with |{name}| <= 1e100")
        check_positive("alpha", self.alpha)

    def scales(self) -> InitScales:
        """The init scales ``(c, lam, gamma)``."""
        return InitScales(c=self.c, lam=self.lam, gamma=self.gamma)

    def task(self) -> TaskSpec:
        """The task ``(rho_pt, rho_ft, overlap)`` with the library's defaults for everything else."""
        return TaskSpec(rho_pt=self.rho_pt, rho_ft=self.rho_ft, overlap=self.overlap)

    def as_dict(self) -> dict[str, float]:
        """The knobs as a flat dict (the page's query parameters)."""
        return asdict(self)


NAMES = tuple(f.name for f in fields(Knobs))


def parse_number(name: str, text: str) -> float:
    """``text`` as a float, or a one-line ``ValueError`` naming ``name`` and the text."""
    try:
        return float(text.strip())
    except ValueError:
        raise ValueError(f"{name}={text.strip()[:40]!r} is not a number") from None


def parse_knobs(query: Mapping[str, str], *, extra: tuple[str, ...] = ()) -> Knobs:
    """Knobs from query parameters (missing ones take the defaults of :class:`Knobs`).

    extra : other parameter names the caller reads itself (they are skipped here). An unknown
    parameter is refused, so that a misspelt knob never silently keeps its default.
    """
    unknown = sorted(set(query) - set(NAMES) - set(extra))
    if unknown:
        raise ValueError(f"{unknown[0]!r} is not a knob: use {', '.join(NAMES)}")
    return Knobs(**{name: parse_number(name, query[name]) for name in NAMES if name in query})
