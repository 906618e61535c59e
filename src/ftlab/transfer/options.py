"""The options of a transfer that do not belong to one method: :class:`TransferOptions`.

Everything that decides *which* statistics a calibration pass collects and *how rows are formed*
lives here (depth map, token alignment, padding, which parameters get a zero delta, precision,
diagnostics); a method's own settings live in its options dataclass (see
:mod:`ftlab.transfer.methods`). Both are frozen and validated.

One object drives the Python API, the command line and the run record:

* every field carries its help text (``dataclasses.fields(TransferOptions)[i].metadata["help"]``)
  and how it is written on a command line (``metadata["cli"]``); ``ftlab transfer`` builds one
  option per field from them (:func:`cli_fields`, :func:`parse_cli_value`);
* :meth:`TransferOptions.record` writes every field as plain JSON and
  :meth:`TransferOptions.from_record` rebuilds the options of a recorded run from it. A field given
  as a Python callable is recorded by its qualified name and must be passed again (ftlab never
  imports code named in a file).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from ftlab.core.validate import check_choice, check_int
from ftlab.transfer.align import SEQ_ALIGN, SeqAlign
from ftlab.transfer.heads import HEAD_RULES, HeadRule
from ftlab.transfer.layer_map import COPY_MODES, DEFAULT_DEPTH_RULE, DEPTH_RULES, CopyMode, DepthRule
from ftlab.transfer.repair import REPAIR_MODES, RepairMode
from ftlab.transfer.spec import DEFAULT_ZERO, NormGain, Rule

__all__ = ["BatchDtype", "TransferOptions", "cli_fields", "parse_cli_value"]

BatchDtype = Literal["float32", "float64"]
_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _opt(default: Any, help: str, cli: str, choices: Sequence[str] = ()) -> Any:
    """A field with its help text and command-line form (``choice``, ``int``, ``float``, ``flag``, ``str``,
    ``globs`` or ``json``)."""
    meta = {"help": help, "cli": cli, "choices": tuple(choices)}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: default, metadata=meta)
    return field(default=default, metadata=meta)


def _callable_name(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def _runs(t: torch.Tensor) -> list[list[int]]:
    """A 1-D integer tensor as runs ``[first, step, count]`` (step 0: repeated; 1: consecutive)."""
    vals = t.tolist()
    out: list[list[int]] = []
    for v in vals:
        if out:
            first, step, count = out[-1]
            nxt = first + step * count
            if count == 1 and v in (first, first + 1):
                out[-1] = [first, v - first, 2]
                continue
            if count > 1 and v == nxt:
                out[-1][2] += 1
                continue
        out.append([v, 0, 1])
    return out


def _from_runs(runs: Sequence[Sequence[int]]) -> torch.Tensor:
    parts = [torch.arange(count, dtype=torch.long) * step + first for first, step, count in runs]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


def _vocab_tensor(v: Any, name: str) -> torch.Tensor:
    if isinstance(v, Mapping) and "runs" in v:
        return _from_runs(v["runs"])
    t = torch.as_tensor(list(v) if not isinstance(v, torch.Tensor) else v)
    if t.ndim != 1 or t.is_floating_point():
        raise ValueError(f"{name} must be a 1-D sequence of integers (target row -> source row, -1: none)")
    return t.long()


@dataclass(frozen=True, eq=False)
class TransferOptions:
    """How a transfer pairs layers, forms calibration rows and records itself (help per field below)."""

    depth_map: DepthRule = _opt(
        DEFAULT_DEPTH_RULE, "which source layer feeds each target layer of a stack: stage_relative (within "
        "corresponding stages by relative depth), nearest_relative (the paper's nearest-index rule over the whole "
        "stack [U]), proportional, prefix, or cka (from block-output similarity); see ftlab.transfer.layer_map",
        "choice", DEPTH_RULES)
    copies: CopyMode = _opt(
        "split", "how a source layer that the depth map pairs with several target layers is shared among them: sum "
        "(each copy at full strength), split (each of k copies at 1/k) or first (the first copy only); "
        "ftlab's option, default chosen on validation data of design pairs",
        "choice", COPY_MODES)
    repair: RepairMode = _opt(
        "mean_std", "after B + alpha tau_B, re-pin the running statistics of B's BatchNorm layers so that each channel's "
        "output mean (mean), or mean and spread (mean_std), on the calibration inputs equals base B's; none: off "
        "(ftlab's option after REPAIR, arXiv 2211.08403, default chosen on validation data of design pairs; a no-op for "
        "models without running statistics; see ftlab.transfer.repair)", "choice", REPAIR_MODES)
    seq_align: SeqAlign = _opt("identity", "how token rows of A and B are paired: identity, interpolate, interpolate2d, "
                               "mean or cls [U]", "choice", SEQ_ALIGN)
    n_prefix: int | None = _opt(None, "leading tokens (CLS, registers) matched one to one by interpolate2d (default: "
                                "those left after the largest square grid)", "int")
    padding_mask: str | Callable | None = _opt(
        "auto", "real-token mask: auto (batch['attention_mask'] when the batch is a mapping), a key of the batch, "
        "none, or (Python) a callable batch -> (B, T) bool", "str")
    seq_first: bool = _opt(False, "captured tensors are (T, B, d) (models with batch_first=False)", "flag")
    zero_params: tuple[str, ...] = _opt(DEFAULT_ZERO, "parameter-name globs whose delta is zero (the target keeps its "
                                        "base value) [U]; comma-separated on the command line", "globs")
    source_overrides: Mapping[str, Sequence[Rule]] | None = _opt(
        None, "hand-written transport rules of the source, {parameter: [rule, ...]} (JSON: rules as "
        "{\"param\", \"kind\", \"point\", \"part\"})", "json")
    target_overrides: Mapping[str, Sequence[Rule]] | None = _opt(None, "hand-written transport rules of the target "
                                                                 "(as source_overrides)", "json")
    all_maps: bool = _opt(False, "also calibrate and fit the maps of target layers through which no nonzero entry of "
                          "tau_A is carried (default: skipped, which leaves tau_B unchanged; the fitted transfer then "
                          "carries only task vectors that are zero there too) [ftlab's]", "flag")
    diagnostics: bool = _opt(False, "also stream A^T A and B^T B for CKA and alignment residuals per layer (more memory "
                             "and time)", "flag")
    batch_dtype: BatchDtype | None = _opt(
        "float64", "precision of each calibration batch product: float64 (exact float64 sums of the rows) or float32 "
        "(float32 products staged and flushed into the float64 sums every 8192 rows; faster, ranks judged at float32 "
        "precision)", "choice", tuple(_DTYPES))
    cka_batches: int = _opt(4, "calibration batches read by depth_map=cka", "int")
    source_stats: Literal["base", "finetuned"] = _opt("base", "statistics of A at its base (default [U]) or at its "
                                                      "fine-tuned weights", "choice", ("base", "finetuned"))
    train_mode: bool = _opt(False, "calibrate with the models in train mode (default eval [U]); BatchNorm then uses batch "
                            "statistics and no output statistic is derived", "flag")
    loss_reduction: Literal["mean", "sum"] = _opt(
        "mean", "mean: the loss averages over a batch's samples, so gradients are multiplied by the batch's sample "
        "count (every sample weighs the same however samples are batched); sum: gradients used as they are", "choice",
        ("mean", "sum"))
    stages: Mapping[str, tuple[Sequence[int], Sequence[int]]] | None = _opt(
        None, "{stack path: [source stage ids, target stage ids]}, overriding the stages stage_relative finds", "json")
    name_map: Mapping[str, str] | Callable[[str], str] | None = _opt(
        None, "dotted name pieces of the target replaced by the source's ({\"attention.attn.q\": "
        "\"attention.self.query\"}), or (Python) a callable target name -> source name", "json")
    vocab_map: Sequence[int] | Mapping[str, Sequence[int]] | None = _opt(
        None, "for embedding tables whose vocabularies differ: the source row each target row continues (-1: none), "
        "as a list, as {\"runs\": [[first, step, count], ...]}, or {table: ...}; e.g. runs [[-1, 0, 4], [0, 1, 30522]] "
        "when B's token id = A's id + 4 (MPNet vs BERT)", "json")
    norm_gain: NormGain = _opt("vector", "rule for norm gains: vector (R_out^T tau, as "
                               "github.com/apanariello4/merge-and-rebase does) or diagonal", "choice",
                               ("vector", "diagonal"))
    memory_limit: float | None = _opt(None, "bytes the calibration statistics may take (default: the memory "
                                      "available); a larger transfer is refused before they are allocated", "float")
    capture_budget: float | None = _opt(
        256e6, "bytes the tensors captured by one forward-backward pass of both models may take (default 256 MB): a "
        "calibration batch whose captures would take more runs in pieces of fewer samples, sized from the bytes per "
        "sample its first piece of 2 samples took; the statistics are sums over rows, so they equal the whole batch's "
        "up to rounding when the loss is a mean (loss_reduction=mean) or sum of per-sample losses; tensors whose first "
        "axis is the sample count are cut, the rest passed whole; whole batches when a captured tensor is not one "
        "per sample (a class token), in train mode or with seq_first; 0 (None in Python): every batch whole", "float")
    statistics: Literal["auto", "dense"] = _opt(
        "auto", "how calibration statistics are kept: auto (the rows themselves for maps at least 256 wide that see "
        "fewer rows than their width: memory and solves in the cost of the rank; float64 cross-covariance sums "
        "otherwise) or dense (always the sums)", "choice", ("auto", "dense"))
    new_heads: tuple[str, ...] = _opt(
        ("auto",), "task heads that are new in both bases (random in A and in B): target module-name globs, and auto "
        "(a PEFT adapter's modules_to_save outside the Hugging Face base model that end in num_labels outputs, "
        "with the target's head modules); comma-separated on the command line, empty for none; see "
        "ftlab.transfer.heads", "globs")
    heads: HeadRule = _opt(
        "refit", "how B's new head is made: refit (fitted in closed form on the labelled calibration rows, on the "
        "features of B + alpha tau_B), carry (A's trained head carried whole by the map of its input rows) or delta "
        "(trained minus random head transported like any parameter); ftlab's option, default chosen on validation "
        "data of a design task", "choice", HEAD_RULES)

    def __post_init__(self) -> None:
        check_choice("depth_map", self.depth_map, DEPTH_RULES)
        check_choice("copies", self.copies, COPY_MODES)
        check_choice("repair", self.repair, REPAIR_MODES)
        check_choice("seq_align", self.seq_align, SEQ_ALIGN)
        if self.n_prefix is not None:
            check_int("n_prefix", self.n_prefix, minimum=0)
        if not (self.padding_mask is None or isinstance(self.padding_mask, str) or callable(self.padding_mask)):
            raise ValueError(f"padding_mask={self.padding_mask!r} is invalid: must be 'auto', a batch key, a callable "
                             "or None")
        if isinstance(self.zero_params, str):
            raise ValueError(f"zero_params={self.zero_params!r} is invalid: must be a list of glob patterns")
        object.__setattr__(self, "zero_params", tuple(self.zero_params))
        dt = self.batch_dtype
        if isinstance(dt, torch.dtype):  # accept torch.float32 / torch.float64 too
            dt = {v: k for k, v in _DTYPES.items()}.get(dt, str(dt))
        check_choice("batch_dtype", "float64" if dt is None else dt, tuple(_DTYPES))
        object.__setattr__(self, "batch_dtype", "float64" if dt is None else dt)
        check_int("cka_batches", self.cka_batches, minimum=1)
        check_choice("source_stats", self.source_stats, ("base", "finetuned"))
        check_choice("loss_reduction", self.loss_reduction, ("mean", "sum"))
        check_choice("norm_gain", self.norm_gain, ("vector", "diagonal"))
        check_choice("statistics", self.statistics, ("auto", "dense"))
        check_choice("heads", self.heads, HEAD_RULES)
        if isinstance(self.new_heads, str):
            raise ValueError(f"new_heads={self.new_heads!r} is invalid: must be a list of module-name globs or 'auto'")
        object.__setattr__(self, "new_heads", tuple(self.new_heads))
        self._check_structures()
        cb = self.capture_budget
        if cb is not None and (isinstance(cb, bool) or not isinstance(cb, (int, float)) or not cb >= 0
                               or cb == float("inf")):
            raise ValueError(f"capture_budget={cb!r} is invalid: must be a number of bytes >= 0 (0 or None: batches "
                             "whole)")
        if cb is not None and cb == 0:
            object.__setattr__(self, "capture_budget", None)
        if self.memory_limit is not None and not (isinstance(self.memory_limit, (int, float)) and self.memory_limit > 0):
            raise ValueError(f"memory_limit={self.memory_limit!r} is invalid: must be a positive number of bytes")

    def _check_structures(self) -> None:
        if self.stages is not None:
            if not isinstance(self.stages, Mapping):
                raise ValueError(f"stages={self.stages!r} is invalid: give {{stack path: (source ids, target ids)}}")
            for path, v in self.stages.items():
                if not (isinstance(v, (tuple, list)) and len(v) == 2):
                    raise ValueError(f"stages[{path!r}] is invalid: give (source stage ids, target stage ids)")
        if self.name_map is not None and not (callable(self.name_map) or isinstance(self.name_map, Mapping)):
            raise ValueError(f"name_map={self.name_map!r} is invalid: give a mapping of name pieces or a callable")
        for side in ("source_overrides", "target_overrides"):
            ov = getattr(self, side)
            if ov is not None and not (isinstance(ov, Mapping) and all(all(isinstance(r, Rule) for r in rules)
                                                                        for rules in ov.values())):
                raise ValueError(f"{side} is invalid: give {{parameter: [Rule, ...]}}")
        vm = self.vocab_map
        if vm is not None:
            if isinstance(vm, Mapping) and "runs" not in vm:
                object.__setattr__(self, "vocab_map", {str(k): _vocab_tensor(v, f"vocab_map[{k!r}]") for k, v in vm.items()})
            else:
                object.__setattr__(self, "vocab_map", _vocab_tensor(vm, "vocab_map"))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TransferOptions) and self.record() == other.record()

    __hash__ = None  # type: ignore[assignment]

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @property
    def torch_batch_dtype(self) -> torch.dtype | None:
        """``batch_dtype`` for :class:`~ftlab.core.stats.CrossMoments`: ``torch.float64``, or ``None`` (float32 staging)."""
        return torch.float64 if self.batch_dtype == "float64" else None

    def record(self) -> dict[str, Any]:
        """Every option as plain JSON (rules as dicts, vocabulary maps as runs, callables by their qualified name)."""
        out: dict[str, Any] = {}
        for name in self.field_names():
            v = getattr(self, name)
            if callable(v) and not isinstance(v, Mapping):
                v = {"callable": _callable_name(v)}
            elif name.endswith("_overrides") and v is not None:
                v = {k: [{**dataclasses.asdict(r), "part": list(r.part)} for r in rules] for k, rules in v.items()}
            elif name == "vocab_map" and v is not None:
                v = ({k: {"runs": _runs(t)} for k, t in v.items()} if isinstance(v, Mapping) else {"runs": _runs(v)})
            elif name == "stages" and v is not None:
                v = {k: [list(a), list(b)] for k, (a, b) in v.items()}
            elif isinstance(v, Mapping):
                v = dict(v)
            elif isinstance(v, tuple):
                v = list(v)
            out[name] = v
        return out

    @classmethod
    def from_record(cls, record: Mapping[str, Any], **given: Any) -> TransferOptions:
        """The options of a recorded run (:meth:`record`), with fields in ``given`` replacing the recorded ones.

        A field that was a Python callable must be given again (``from_record(rec, padding_mask=fn)``);
        an unknown field is an error naming it.
        """
        names = set(cls.field_names())
        unknown = sorted(set(record) - names) + sorted(set(given) - names)
        if unknown:
            raise ValueError(f"the record holds an unknown transfer option {unknown[0]!r}")
        kw: dict[str, Any] = {}
        for name, v in record.items():
            if name in given:
                continue
            if isinstance(v, Mapping) and set(v) == {"callable"}:
                raise ValueError(f"the recorded option {name!r} was the Python callable {v['callable']!r}: pass it again "
                                 f"(from_record(record, {name}=...))")
            kw[name] = _from_json(name, v)
        return cls(**kw, **given)


def _rules(v: Any, name: str) -> dict[str, tuple[Rule, ...]]:
    if not isinstance(v, Mapping):
        raise ValueError(f"{name} must be a mapping {{parameter: [rule, ...]}}")
    try:
        return {str(k): tuple(Rule(**{**r, "part": tuple(r.get("part", (0, 1)))}) for r in rules) for k, rules in v.items()}
    except TypeError as exc:
        raise ValueError(f"{name}: a rule is not {{\"param\", \"kind\", \"point\", \"part\"}} ({exc})") from None


def _from_json(name: str, v: Any) -> Any:
    """One option from its JSON form (:meth:`TransferOptions.record`)."""
    if v is None:
        return None
    if name.endswith("_overrides"):
        return _rules(v, name)
    if name == "stages":
        if not isinstance(v, Mapping):
            raise ValueError("stages must be a mapping {stack path: [source ids, target ids]}")
        return {str(k): (tuple(a), tuple(b)) for k, (a, b) in v.items()}
    if name in ("zero_params", "new_heads"):
        return tuple(v)
    return v


def cli_fields() -> list[dataclasses.Field]:
    """The fields of :class:`TransferOptions` that a command line can set (all of them)."""
    return list(dataclasses.fields(TransferOptions))


def parse_cli_value(f: dataclasses.Field, text: str) -> Any:
    """A field's value from its command-line text (see ``metadata["cli"]``); ``ValueError`` names the option."""
    kind = f.metadata["cli"]
    flag = "--" + f.name.replace("_", "-")
    try:
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
        if kind == "globs":
            return tuple(p.strip() for p in text.split(",") if p.strip())
        if kind == "str":
            return None if text.lower() == "none" else text
        if kind == "json":
            value = json.loads(text) if text.lstrip()[:1] in ("{", "[") else json.loads(Path(text).read_text("utf-8"))
            return _from_json(f.name, value)
    except (ValueError, OSError) as exc:
        raise ValueError(f"{flag}={text!r} is invalid: {exc}") from None
    return text
