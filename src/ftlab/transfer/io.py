"""Reading models, checkpoints and calibration files safely; writing checkpoints atomically.

* Checkpoints: safetensors, or ``torch.load(weights_only=True)``. Pickled checkpoints that need
  arbitrary code to load are refused (``ValueError``), never unpickled. A Hugging Face model folder
  is read from its ``model.safetensors``, or from the shards listed in
  ``model.safetensors.index.json`` -- every shard name must stay inside the folder (no ``..``, no
  absolute path, no symlink out of it) -- or from a weights-only ``pytorch_model.bin``.
* :func:`load_model`: an architecture (a Hugging Face config folder or a ``module:function``
  factory) with a checkpoint's weights. A model folder's own Python code never runs unless the
  caller passes ``trust_remote_code=True``: a ``config.json`` that names code of its own
  (``auto_map``) is refused before transformers sees it, every transformers call gets
  ``trust_remote_code`` explicitly and reads local files only, so no question is ever asked.
* :func:`load_batches`: calibration batches from a tensor file or a ``module:function`` factory.

Every problem with a file is a ``ValueError`` naming the file (and the field or tensor); an error
raised by the user's factory or model code is a :class:`~ftlab.core.usercode.UserCodeError` naming
the role (``"target base: ..."``).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import torch

__all__ = ["check_checkpoint", "hf_checkpoint_keys", "index_shards", "load_batches", "load_model", "load_state_dict",
           "save_state_dict"]

_TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


def _reason(exc: BaseException) -> str:
    """The first line of an exception's message, or its type when it has none."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _load_torch(path: Path, *, mmap: bool = False) -> dict[str, torch.Tensor]:
    """A weights-only torch file (``mmap``: its tensors mapped, not read -- enough to check it)."""
    import pickle

    if path.is_file() and path.stat().st_size == 0:
        raise ValueError(f"cannot read checkpoint {str(path)!r}: the file is empty (0 bytes)")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        raise ValueError(f"refusing to unpickle {str(path)!r}: it is not a weights-only checkpoint "
                         "(convert it to safetensors)") from exc
    except (RuntimeError, EOFError, OSError) as exc:
        if mmap and "mmap" in str(exc):  # a file of torch's legacy format cannot be mapped: read it
            return _load_torch(path)
        raise ValueError(f"cannot read checkpoint {str(path)!r}: {_reason(exc)}") from exc
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f"checkpoint {str(path)!r} is not a flat mapping of names to tensors")
    return dict(obj)


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types
        raise ValueError(f"cannot read safetensors file {str(path)!r}: {_reason(exc)}") from exc


def _check_safetensors(path: Path) -> None:
    """Read the header of a safetensors file (its tensors are not read)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            fh.keys()
    except Exception as exc:  # safetensors raises its own error types
        raise ValueError(f"cannot read safetensors file {str(path)!r}: {_reason(exc)}") from exc


def _weight_map(index: Path) -> dict[str, str]:
    from ftlab.core.results import read_json_object

    weight_map = read_json_object(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{index}: field 'weight_map' is missing or empty (it maps tensor names to shard files)")
    return weight_map


def index_shards(folder: str | os.PathLike) -> list[Path]:
    """The shard files named by ``folder/model.safetensors.index.json``, each confined to ``folder``.

    A name that is not a string, is absolute, has a ``..`` part or resolves (through symlinks) outside
    the folder is refused with a ``ValueError`` naming the index file and the field.
    """
    from ftlab.core.results import confined_path

    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    source = f"{index}, field 'weight_map'"
    names = sorted({v for v in _weight_map(index).values()}, key=str)
    shards = [confined_path(folder, name, source=source) for name in names]
    for name, shard in zip(names, shards):
        if not shard.is_file():
            raise ValueError(f"{source}: shard {name!r} does not exist in {str(folder)!r}")
    return shards


def load_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Load a flat ``{name: tensor}`` from a ``.safetensors`` file, a weights-only torch file or an HF folder."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    if path.is_dir():
        single = path / "model.safetensors"
        index = path / "model.safetensors.index.json"
        if single.exists():
            return _load_safetensors(single)
        if index.exists():
            weight_map = _weight_map(index)
            out: dict[str, torch.Tensor] = {}
            for shard in index_shards(path):
                out.update(_load_safetensors(shard))
            missing = [k for k in weight_map if k not in out]
            if missing:
                raise ValueError(f"{index}: field 'weight_map' lists {missing[0]!r} ({len(missing)} in all), which "
                                 "none of its shards holds")
            return out
        if (path / "pytorch_model.bin").exists():
            return _load_torch(path / "pytorch_model.bin")
        raise FileNotFoundError(f"folder {str(path)!r} holds no model.safetensors or pytorch_model.bin")
    if path.suffix == ".safetensors":
        return _load_safetensors(path)
    if path.suffix in _TORCH_SUFFIXES:
        return _load_torch(path)
    raise ValueError(f"checkpoint {str(path)!r} has an unknown suffix: use .safetensors, a weights-only "
                     f"{'/'.join(_TORCH_SUFFIXES)} file, or a Hugging Face model folder")


def check_checkpoint(path: str | os.PathLike) -> None:
    """Refuse, before any work, a checkpoint :func:`load_state_dict` would refuse: missing, empty, pickled (code),
    unreadable, or a folder without weights. Reads headers only (safetensors) or maps the tensors without reading
    them (torch files), so checking costs little beside the loading that follows."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    if path.is_dir():
        files = [path / "model.safetensors"] if (path / "model.safetensors").exists() else \
            index_shards(path) if (path / "model.safetensors.index.json").exists() else \
            [path / "pytorch_model.bin"] if (path / "pytorch_model.bin").exists() else []
        if not files:
            raise FileNotFoundError(f"folder {str(path)!r} holds no model.safetensors or pytorch_model.bin")
    else:
        files = [path]
    for f in files:
        if f.suffix == ".safetensors":
            _check_safetensors(f)
        elif f.suffix in _TORCH_SUFFIXES:
            _load_torch(f, mmap=True)
        else:
            load_state_dict(f)  # the refusal of an unknown suffix


def save_state_dict(path: str | os.PathLike, state: dict[str, torch.Tensor], *,
                    metadata: dict[str, str] | None = None) -> Path:
    """Atomically write ``state`` as safetensors (tensors are copied, so tied weights are fine)."""
    from safetensors.torch import save

    from ftlab.core.results import atomic_write_bytes

    data = save({k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}, metadata=metadata)
    return atomic_write_bytes(path, data)


def _read_config(folder: Path, role: str, trust_remote_code: bool) -> None:
    """Check ``folder/config.json`` as plain JSON before transformers reads it; refuse code of its own."""
    path = folder / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{role}: architecture folder {str(folder)!r} has no config.json")
    from ftlab.core.results import read_json_object

    config = read_json_object(path, role=role)
    if "auto_map" in config and not trust_remote_code:
        raise ValueError(f"{role}: {path}, field 'auto_map': the folder asks to run Python code of its own; ftlab "
                         "does not run a model folder's code unless told to (--trust-remote-code, which runs it)")


def _hf_model(folder: Path, hf_class: str, role: str, trust_remote_code: bool, num_labels: int | None = None):
    _read_config(folder, role, trust_remote_code)
    import transformers

    from ftlab.core.usercode import blame

    found = getattr(transformers, hf_class, None) if hf_class.isidentifier() else None
    if not isinstance(found, type) or not (hasattr(found, "from_config") or hasattr(found, "config_class")):
        raise ValueError(f"--hf-class={hf_class!r} is not a model class of transformers")
    cls: Any = found
    with blame(f"{role}: reading {folder}/config.json"):
        config = transformers.AutoConfig.from_pretrained(str(folder), trust_remote_code=trust_remote_code,
                                                         local_files_only=True)
    if num_labels is not None:
        config.num_labels = num_labels
    with blame(f"{role}: building {hf_class} from {folder}/config.json"):
        if hf_class.startswith("Auto"):
            return cls.from_config(config, trust_remote_code=trust_remote_code)
        return cls(config)


def _fit_weights(model: torch.nn.Module, state: dict[str, torch.Tensor], checkpoint: str, role: str) -> None:
    own = model.state_dict()
    params = dict(model.named_parameters())
    missing = [k for k in own if k not in state and k in params]
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        raise ValueError(f"{role}: checkpoint {checkpoint!r} does not fit the architecture "
                         f"(missing {missing[:2]}, unexpected {unexpected[:2]})")
    for k, v in state.items():
        if own[k].shape != v.shape:
            raise ValueError(f"{role}: {k!r} has shape {tuple(v.shape)} in the checkpoint "
                             f"but {tuple(own[k].shape)} in the model")


def hf_checkpoint_keys(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict]:
    """``state`` renamed to a Hugging Face ``model``'s names by transformers' own base-model prefix rule, and what
    the model gives itself.

    transformers (``core_model_loading.rename_source_key``) loads a checkpoint of the base model (``BertModel``,
    keys ``encoder.*``) into a class with a task head (``BertForSequenceClassification``, keys ``bert.encoder.*``)
    and the reverse by adding or stripping ``model.base_model_prefix`` per key, whichever names a key of the model;
    the same rule is applied here. What follows from it, also as transformers does:

    * ``fresh``: parameters the checkpoint does not hold and that lie *outside* the base model (the task head a
      base checkpoint lacks); they keep the values the model was built with (a new head);
    * ``dropped``: checkpoint keys the model has no place for: non-persistent buffers saved by older versions
      (``embeddings.position_ids``), keys matching the class's ``_keys_to_ignore_on_load_unexpected``, and, when a
      prefix was added or stripped, the parts of the other class the model lacks (a pooler, a head).

    A parameter of the base model itself that the checkpoint lacks stays missing (the caller's fit check names
    it). A model without ``base_model_prefix`` (not a transformers model) gets ``state`` back unchanged.
    """
    import re

    prefix = getattr(model, "base_model_prefix", "") or ""
    report: dict = {"prefix": None, "fresh": [], "dropped": []}
    if not prefix or not hasattr(model, "config"):
        return state, report
    own = model.state_dict()
    p = prefix + "."
    out: dict[str, torch.Tensor] = {}
    for k, v in state.items():
        if k not in own and k.startswith(p) and k[len(p):] in own:
            out[k[len(p):]], report["prefix"] = v, "stripped"
        elif k not in own and p + k in own:
            out[p + k], report["prefix"] = v, "added"
        else:
            out[k] = v
    buffers = {n.rpartition(".")[2] for n, _ in model.named_buffers()}
    ignore = [re.compile(pat) for pat in getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ()]
    for k in [k for k in out if k not in own]:
        if k.rpartition(".")[2] in buffers or any(pat.search(k) for pat in ignore) or report["prefix"] is not None:
            report["dropped"].append(k)
            del out[k]
    base = getattr(model, prefix, None)
    if isinstance(base, torch.nn.Module) and base is not model:
        params = dict(model.named_parameters())
        report["fresh"] = sorted(k for k in params if k not in out and not k.startswith(p))
        out.update({k: own[k] for k in report["fresh"]})
    return out, report


def _on_meta(model: torch.nn.Module) -> list[str]:
    return [k for k, v in itertools.chain(model.named_parameters(), model.named_buffers()) if v.is_meta]


def load_model(arch: str | None, checkpoint: str | os.PathLike, *, hf_class: str = "AutoModel", role: str,
               trust_remote_code: bool = False, report: dict | None = None, num_labels: int | None = None
               ) -> torch.nn.Module:
    """A model for ``checkpoint`` in eval mode: its architecture, then its weights.

    arch : a Hugging Face config folder, a ``module:function`` / ``file.py:function`` factory returning
        an ``nn.Module``, or ``None`` when ``checkpoint`` is itself a Hugging Face folder.
    hf_class : the transformers class built from a config folder (``Auto*`` classes via ``from_config``).
    role : names the model in every error, e.g. ``"target base"`` (its first word names the
        ``--<word>-arch`` option in the hint for a missing architecture).
    trust_remote_code : run the Python code a config folder names (``auto_map``); off by default, and
        such a folder is then refused (see the module docstring).
    num_labels : the number of labels of a Hugging Face task class built from a config folder (replacing the
        config's; for a base folder, whose config.json names none).
    report : a dict that receives what loading a Hugging Face checkpoint into another class of the same model
        did (:func:`hf_checkpoint_keys`: ``prefix`` added or stripped, ``fresh`` head parameters the model
        initialised itself, ``dropped`` checkpoint keys it has no place for).

    The checkpoint must fit: every parameter given, no unknown key, the same shapes -- except that a Hugging Face
    model takes a checkpoint of its base model or of another head class by transformers' own prefix rule
    (:func:`hf_checkpoint_keys`; e.g. an ``all-MiniLM-L6-v2`` folder saved as ``BertModel`` loaded as
    ``BertForSequenceClassification``: the classifier is then new).
    """
    from ftlab.core.usercode import blame, load_callable

    checkpoint = str(checkpoint)
    ckpt = Path(checkpoint)
    if arch is None:
        if ckpt.is_dir() and (ckpt / "config.json").exists():
            arch = checkpoint
        else:
            flag = f"--{role.split()[0]}-arch"
            raise ValueError(f"{role}: {checkpoint!r} is not a Hugging Face folder; give its architecture with {flag}")
    if Path(arch).is_dir():
        model = _hf_model(Path(arch), hf_class, role, trust_remote_code, num_labels)
    else:
        factory = load_callable(arch, f"{role} architecture")
        with blame(f"{role}: architecture factory {arch}"):
            model = factory()
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"{role}: the architecture factory returned {type(model).__name__}, not an nn.Module")
    state, loaded = hf_checkpoint_keys(model, load_state_dict(checkpoint))
    if report is not None:
        report.update(loaded)
    _fit_weights(model, state, checkpoint, role)
    model.load_state_dict(state, strict=False, assign=bool(_on_meta(model)))  # built on meta: take the tensors
    meta = _on_meta(model)
    if meta:
        raise ValueError(f"{role}: {meta[0]!r} is on the meta device (it has no values) and checkpoint {checkpoint!r} "
                         "does not give it")
    return model.eval()


def _split(path: Path, batch_size: int) -> list[dict[str, torch.Tensor]]:
    data = load_state_dict(path)
    if not data:
        raise ValueError(f"calibration file {str(path)!r} holds no tensors")
    scalar = [k for k, v in data.items() if v.dim() == 0]
    if scalar:
        raise ValueError(f"calibration file {str(path)!r}: tensor {scalar[0]!r} is a scalar; every tensor needs a "
                         "first (sample) dimension")
    sizes = {int(v.shape[0]) for v in data.values()}
    if len(sizes) != 1:
        raise ValueError(f"calibration file {str(path)!r}: tensors differ in their first dimension ({sorted(sizes)})")
    n = sizes.pop()
    return [{k: v[i:i + batch_size] for k, v in data.items()} for i in range(0, n, batch_size)]


def load_batches(ref: str, batch_size: int, max_batches: int | None = None, *, what: str = "--data") -> list:
    """Calibration batches from a tensor file or a ``module:function`` factory.

    A ``.safetensors`` / weights-only torch file (or any existing file) holds tensors with a common
    first dimension, split into dict batches of ``batch_size`` rows; otherwise ``ref`` names a factory
    returning an iterable of batches (called, and iterated, as the user's code: its errors are
    :class:`~ftlab.core.usercode.UserCodeError` naming ``what``). At most ``max_batches`` are kept.
    """
    from ftlab.core.usercode import blame, load_callable
    from ftlab.core.validate import check_int

    check_int("batch_size", batch_size, 1)
    if max_batches is not None:
        check_int("max_batches", max_batches, 1)
    path = Path(ref)
    if path.suffix in (".safetensors", *_TORCH_SUFFIXES) or path.is_file():
        batches = _split(path, batch_size)
    else:
        factory = load_callable(ref, what)
        with blame(f"{what} {ref}: the calibration factory"):
            batches = list(itertools.islice(factory(), max_batches))
    batches = batches if max_batches is None else batches[:max_batches]
    if not batches:
        raise ValueError(f"calibration data {ref!r} yielded no batches")
    return batches
