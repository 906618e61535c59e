"""Transfer methods: a registry of objects with ``prepare`` (fit from calibration) and ``apply``.

Each entry has a short name, a human name, a description and the paper it comes from
(mergekit-style). :func:`get_method` builds a fresh method object from its short name and options.

=================  ==========================================================================
short name         what it does
=================  ==========================================================================
``bico``           ``R_in`` from input activations, ``R_out`` from output gradients (BiCo)
``activation_only`` both maps from activations: input and output (Theseus-like)
``gradient_only``  ``R_out`` from output gradients, ``R_in`` from input-side gradients
``naive``          pad/truncate (identity when shapes match)
``identity``       the source task vector unchanged (same shapes required)
``gradfix``        keep the coordinates whose sign agrees with the target's descent direction
=================  ==========================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["MethodInfo", "get_method", "list_methods", "register"]


@dataclass(frozen=True)
class MethodInfo:
    """A registry entry: ``name`` (short), ``human_name``, ``description``, ``reference``."""

    name: str
    human_name: str
    description: str
    reference: str
    factory: Callable


_REGISTRY: dict[str, MethodInfo] = {}


def register(name: str, *, human_name: str, description: str, reference: str):
    """Decorator registering a method factory (a class or function returning a method object)."""

    def deco(factory):
        if name in _REGISTRY:
            raise ValueError(f"transfer method {name!r} is already registered")
        _REGISTRY[name] = MethodInfo(name, human_name, description, reference, factory)
        return factory

    return deco


def _load() -> None:
    from ftlab.transfer.methods import baselines, procrustes  # noqa: F401  (registers the methods)


def list_methods() -> list[MethodInfo]:
    """All registered methods, in registration order."""
    _load()
    return list(_REGISTRY.values())


def get_method(name: str, **options):
    """A new method object for the short ``name`` configured with ``options``."""
    _load()
    if name not in _REGISTRY:
        raise ValueError(f"method={name!r} is invalid: must be one of {', '.join(_REGISTRY)}")
    return _REGISTRY[name].factory(**options)
