"""The transfers the benchmark compares: registered methods, and variants of them with ftlab's options.

A *variant* is a registered transfer method (:func:`ftlab.transfer.list_methods`) with method options and two
transfer options of ftlab's: ``copies`` (how a source layer that feeds several target layers is shared among them)
and ``repair`` (re-pinned BatchNorm statistics after the transfer, :mod:`ftlab.transfer.repair`). Variants that
share a method and its options share one fit: their copy rule is applied to the fitted maps' output
(:meth:`ftlab.transfer.TransferResult.with_copies`) and their repair to the model, without a new calibration.

Every registered method is a variant of its own name with the plain settings (copies summed, no repair). The
named variants (:data:`VARIANTS`):

==========================  ===========================================================================================
``bico``                    BiCo with uncentred cross-covariances, as the public reimplementation
                            ``apanariello4/merge-and-rebase`` does (``center_acts=False``); whether the paper centres is
                            not confirmed. Copies summed, no repair: the transfer the paper's claims are judged on.
``bico_centred``            the same with centred cross-covariances (ftlab's variant).
``naive+repair``            pad/truncate with the statistics repair (a control: the repair alone, without alignment).
``bico+repair``             uncentred BiCo with ftlab's copy rule and repair.
``bico_centred+repair``     centred BiCo with ftlab's copy rule and repair.
``recommended``             ftlab's recommended transfer: the library's defaults (:data:`RECOMMENDED`), chosen on the
                            validation data of the design pairs; judged with alpha searched on validation.
``recommended/<copies>``    the recommended transfer under each copy rule (``sum``, ``split``, ``first``).
==========================  ===========================================================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ftlab.transfer.layer_map import COPY_MODES

__all__ = ["RECOMMENDED", "VARIANTS", "Variant", "fit_key", "get_variant", "variant_names"]


@dataclass(frozen=True)
class Variant:
    """A registered method with method options (``options``, sorted pairs) and ftlab's copy rule and repair."""

    name: str
    method: str
    options: tuple[tuple[str, Any], ...] = ()
    copies: str = "sum"
    repair: str = "none"

    @property
    def method_options(self) -> dict[str, Any]:
        return dict(self.options)


#: ftlab's recommended transfer: BiCo with these settings and alpha chosen on validation data. Fixed on the
#: validation data of the design pairs (docs/transfer-benchmark.md, "Choosing the defaults"); the library's defaults
#: (:class:`ftlab.transfer.TransferOptions`, :class:`ftlab.transfer.methods.procrustes.ProcrustesOptions`) are the same.
RECOMMENDED: Mapping[str, Any] = {"center": False, "copies": "split", "repair": "mean_std"}


def _recommended(name: str, copies: str) -> Variant:
    return Variant(name, "bico", (("center", RECOMMENDED["center"]),), copies, RECOMMENDED["repair"])


VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("bico", "bico", (("center", False),)),
    Variant("bico_centred", "bico", (("center", True),)),
    Variant("naive+repair", "naive", (), "sum", RECOMMENDED["repair"]),
    Variant("bico+repair", "bico", (("center", False),), RECOMMENDED["copies"], RECOMMENDED["repair"]),
    Variant("bico_centred+repair", "bico", (("center", True),), RECOMMENDED["copies"], RECOMMENDED["repair"]),
    _recommended("recommended", RECOMMENDED["copies"]),
    *(_recommended(f"recommended/{c}", c) for c in COPY_MODES),
)}


def variant_names() -> list[str]:
    """Every name a benchmark may list: the registered methods and :data:`VARIANTS`."""
    from ftlab.transfer.methods import method_names

    return sorted(set(method_names()) | set(VARIANTS))


def get_variant(name: str) -> Variant:
    """The variant ``name`` (a registered method is the plain variant of itself); ``ValueError`` names the choices."""
    from ftlab.core.validate import check_choice

    check_choice("method", name, variant_names())
    return VARIANTS.get(name) or Variant(name, name)


def fit_key(v: Variant) -> tuple:
    """Variants with the same key share one fit."""
    return (v.method, v.options)
