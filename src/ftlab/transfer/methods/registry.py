"""The method interface and the registry of methods.

A **method** (:class:`Method`) is configured once (its frozen options dataclass) and never changes
afterwards. It declares what it reads besides the task vector (:attr:`Method.calibration`: paired
statistics of both models, the target's gradients, or both bases themselves; for statistics,
:meth:`Method.requirements` per point), may refuse a problem before any work (:meth:`Method.check`), and
fits from what :func:`ftlab.transfer.fit_transfer` collects for it -- every method goes through the same
door, the caller never prepares a method by its name: :meth:`Method.prepare` returns a new, frozen **fitted transfer**
(:class:`FittedTransfer`) whose :meth:`~FittedTransfer.apply` carries a source task vector onto the
target. One method object can therefore be fitted on several problems, and a fitted transfer can be
applied to several task vectors of the same source (e.g. one per task).

The registry (:func:`register`, :func:`list_methods`, :func:`get_method`) is the only list of
methods and of their options: :func:`ftlab.transfer.transfer`, the CLI's ``--method`` choices and
``--method-option`` help, and the benchmark all read it. Each entry has a short name, a human name,
a description, a reference a reader can open, what the method needs, its options class and the
preset that distinguishes it (e.g. ``bico`` = Procrustes with ``in_map="act"``, ``out_map="grad"``),
in the spirit of mergekit's method registry. The built-in methods are registered when
:mod:`ftlab.transfer.methods` is imported (every module of its folder registers its own, so a built-in
method is one module and its test), so a user's method cannot take a built-in name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, Union, runtime_checkable

if TYPE_CHECKING:
    from ftlab.transfer.align import MapFit
    from ftlab.transfer.calibrate import TargetGradients
    from ftlab.transfer.problem import TransferProblem
    from ftlab.transfer.spec import Point
    from ftlab.transfer.task_vector import TaskVector

__all__ = ["Bases", "Calibration", "FittedTransfer", "Method", "MethodInfo", "Requirements", "Statistics", "get_method",
           "list_methods", "method_info", "method_names", "option_help", "reads_batches", "register"]

#: What a method reads besides the task vector, collected for it by :func:`ftlab.transfer.fit_transfer`:
#: paired statistics of both models over the calibration batches for Procrustes maps (``"maps"``), gradients
#: of the target's parameters over them (``"target_grads"``), both base models themselves (``"bases"``: their
#: weights; no data), or nothing (``None``).
Calibration = Literal["maps", "target_grads", "bases"] | None


@dataclass(frozen=True)
class Bases:
    """What a method with ``calibration="bases"`` receives: the source and target base models (not to be changed)."""

    source: Any
    target: Any


def reads_batches(method: Method) -> bool:
    """Whether ``method`` reads calibration batches (``calibration`` ``"maps"`` or ``"target_grads"``)."""
    return method.calibration in ("maps", "target_grads")

#: ``{"in": statistics, "out": statistics}`` of one capture point, the fitted statistic first (names
#: from :data:`ftlab.transfer.plan.CAPTURED`: ``act``, ``grad``, ``grad_in``); an empty tuple: none.
Requirements = Mapping[str, tuple[str, ...]]

#: What :meth:`Method.prepare` receives: ``{(target point, side, statistic): cross statistics}`` for
#: ``calibration="maps"``, a :class:`~ftlab.transfer.calibrate.TargetGradients` for
#: ``"target_grads"``, :class:`Bases` for ``"bases"``, ``None`` for methods that read nothing.
Statistics = Union[Mapping[tuple[str, str, str], Any], "TargetGradients", "Bases", None]


@runtime_checkable
class FittedTransfer(Protocol):
    """A fitted transfer: frozen, it carries a source task vector onto the target.

    ``fits[target point] = (input-side fit, output-side fit)`` (:class:`~ftlab.transfer.align.MapFit`
    or None) for methods that fit maps; empty otherwise.
    """

    @property
    def fits(self) -> Mapping[str, tuple[MapFit | None, MapFit | None]]: ...

    def apply(self, tau_a: TaskVector) -> TaskVector:
        """The target task vector (keyed by the target's parameter names)."""
        ...


@runtime_checkable
class Method(Protocol):
    """The interface of a transfer method (see the module docstring).

    ``name`` : the registry name; ``options`` : a frozen dataclass of its settings; ``calibration`` :
    see :data:`Calibration`; ``needs_loss`` : whether the calibration needs ``loss(model, batch)``
    (and so labels or another training signal) rather than forward passes alone;
    ``needs_second_moments`` : whether its statistics must hold ``A^T A`` and ``B^T B``.
    """

    name: str
    options: Any
    calibration: Calibration

    @property
    def needs_loss(self) -> bool: ...

    @property
    def needs_second_moments(self) -> bool: ...

    def requirements(self, point: Point) -> Requirements:
        """Statistics to collect on each side of a capture point (``calibration="maps"`` only)."""
        ...

    def check(self, tau_a: TaskVector, problem: TransferProblem) -> None:
        """Raise ``ValueError`` before any calibration when this method cannot solve ``problem``."""
        ...

    def prepare(self, problem: TransferProblem, stats: Statistics) -> FittedTransfer:
        """Fit from the calibration statistics; a new frozen :class:`FittedTransfer` (the method is not changed)."""
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
    """Decorator registering a method class under ``name`` (the same class may serve several presets).

    The class is built as ``cls(options_object, name=name)``. A name already taken (a built-in one
    included) raises ``ValueError``.
    """

    def deco(cls):
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"method name {name!r} is invalid: use letters, digits and underscores")
        if name in _REGISTRY:
            raise ValueError(f"transfer method {name!r} is already registered")
        if not dataclasses.is_dataclass(options):
            raise TypeError(f"options of method {name!r} must be a dataclass")
        _REGISTRY[name] = MethodInfo(name, human_name, description, reference, needs, options, cls, dict(preset or {}))
        return cls

    return deco


def list_methods() -> list[MethodInfo]:
    """All registered methods, in registration order (the built-in ones first)."""
    return list(_REGISTRY.values())


def method_names() -> tuple[str, ...]:
    """Short names of all registered methods."""
    return tuple(_REGISTRY)


def get_method(name: str, **options) -> Method:
    """A new method object for the short ``name`` configured with ``options`` (validated)."""
    if name not in _REGISTRY:
        raise ValueError(f"method={name!r} is invalid: must be one of {', '.join(_REGISTRY)}")
    info = _REGISTRY[name]
    return info.cls(info.options(**options), name=name)


def method_info(name: str) -> MethodInfo:
    """The registry entry of ``name``."""
    if name not in _REGISTRY:
        raise ValueError(f"method={name!r} is invalid: must be one of {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def option_help(info: MethodInfo) -> list[tuple[str, str, Any]]:
    """``(option, help, default)`` for every option of a method (help from the dataclass field metadata)."""
    out = []
    for f in dataclasses.fields(info.options_type):
        default = info.preset.get(f.name, f.default)
        out.append((f.name, f.metadata.get("help", ""), default))
    return out
