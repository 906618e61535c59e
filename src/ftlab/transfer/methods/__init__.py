"""Transfer methods: one declared interface, one registry.

A method is an object satisfying :class:`Method`: it says which calibration statistics it needs
(:attr:`Method.calibration`, :meth:`Method.requirements`), fits its maps from them
(:meth:`Method.prepare`) and carries a source task vector onto the target (:meth:`Method.apply`).
Its settings are a frozen, validated dataclass (:attr:`Method.options`), recorded in full with every
run.

The registry (:func:`register`, :func:`list_methods`, :func:`get_method`) is the only list of
methods and of their options: :func:`ftlab.transfer.transfer`, the CLI's ``--method`` choices and
``--method-option`` help, and the benchmark all read it. Each entry has a short name, a human name,
a description, a reference a reader can open, what the method needs, its options class and the
preset that distinguishes it (e.g. ``bico`` = Procrustes with ``in_map="act"``, ``out_map="grad"``),
in the spirit of mergekit's method registry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ftlab.transfer.problem import TransferProblem
    from ftlab.transfer.spec import Point
    from ftlab.transfer.task_vector import TaskVector

__all__ = ["Calibration", "Method", "MethodInfo", "get_method", "list_methods", "method_names", "option_help",
           "register"]

#: What a method's calibration pass collects: paired statistics of both models for Procrustes maps
#: (``"maps"``), gradients of the target's parameters (``"target_grads"``), or nothing (``None``).
Calibration = Literal["maps", "target_grads"] | None


@runtime_checkable
class Method(Protocol):
    """The interface of a transfer method.

    ``name`` : the registry name; ``options`` : a frozen dataclass of its settings; ``calibration`` :
    see :data:`Calibration`; ``needs_loss`` : whether the calibration needs ``loss(model, batch)``
    (and so labels or another training signal) rather than forward passes alone.
    """

    name: str
    options: Any
    calibration: Calibration

    @property
    def needs_loss(self) -> bool: ...

    @property
    def needs_second_moments(self) -> bool: ...

    def requirements(self, point: Point) -> dict[str, str | None]:
        """Statistic needed on each side of a capture point: ``{"in": ..., "out": ...}`` (None = none)."""
        ...

    def check(self, tau_a: TaskVector, problem: TransferProblem) -> None:
        """Fail before any calibration when the problem cannot be solved by this method."""
        ...

    def prepare(self, problem: TransferProblem, stats: Any) -> Method:
        """Fit from the calibration statistics; returns ``self``."""
        ...

    def apply(self, tau_a: TaskVector) -> TaskVector:
        """The target task vector (keyed by the target's parameter names)."""
        ...


@dataclass(frozen=True)
class MethodInfo:
    """A registry entry.

    ``name`` short name; ``human_name``; ``description`` one line; ``reference`` a paper (arXiv id) or
    public repository; ``needs`` what the method needs from the user in words; ``options_type`` the
    frozen options dataclass; ``preset`` the option values that define this method; ``cls`` the class
    built as ``cls(options, name=...)``.
    """

    name: str
    human_name: str
    description: str
    reference: str
    needs: str
    options_type: type
    cls: Callable[..., Method]
    preset: Mapping[str, Any] = field(default_factory=dict)

    def options(self, **overrides) -> Any:
        """The validated options object for this method with ``overrides``."""
        valid = [f.name for f in dataclasses.fields(self.options_type)]
        unknown = [k for k in overrides if k not in valid]
        if unknown:
            raise ValueError(f"invalid option {unknown[0]!r} for method {self.name!r}: "
                             f"valid options are {', '.join(valid) or 'none'}")
        return self.options_type(**{**self.preset, **overrides})


_REGISTRY: dict[str, MethodInfo] = {}


def register(name: str, *, human_name: str, description: str, reference: str, needs: str, options: type,
             preset: Mapping[str, Any] | None = None):
    """Decorator registering a method class under ``name`` (the same class may serve several presets)."""

    def deco(cls):
        if name in _REGISTRY:
            raise ValueError(f"transfer method {name!r} is already registered")
        if not dataclasses.is_dataclass(options):
            raise TypeError(f"options of method {name!r} must be a dataclass")
        _REGISTRY[name] = MethodInfo(name, human_name, description, reference, needs, options, cls, dict(preset or {}))
        return cls

    return deco


def _load() -> None:
    from ftlab.transfer.methods import baselines, procrustes  # noqa: F401  (registers the methods)


def list_methods() -> list[MethodInfo]:
    """All registered methods, in registration order."""
    _load()
    return list(_REGISTRY.values())


def method_names() -> tuple[str, ...]:
    """Short names of all registered methods."""
    return tuple(m.name for m in list_methods())


def get_method(name: str, **options) -> Method:
    """A new method object for the short ``name`` configured with ``options`` (validated)."""
    _load()
    if name not in _REGISTRY:
        raise ValueError(f"method={name!r} is invalid: must be one of {', '.join(_REGISTRY)}")
    info = _REGISTRY[name]
    return info.cls(info.options(**options), name=name)


def option_help(info: MethodInfo) -> list[tuple[str, str, Any]]:
    """``(option, help, default)`` for every option of a method (help from the dataclass field metadata)."""
    out = []
    for f in dataclasses.fields(info.options_type):
        default = info.preset.get(f.name, f.default)
        out.append((f.name, f.metadata.get("help", ""), default))
    return out
