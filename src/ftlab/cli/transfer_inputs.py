"""What ``ftlab transfer`` reads: models, the source fine-tuning, calibration data and the loss."""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Calibration", "build_model", "calibration_data", "default_loss", "load_batches", "load_callable",
           "parse_floats"]


def load_callable(ref: str, what: str):
    """``module:function`` or ``path/to/file.py:function`` -> the callable."""
    if ":" not in ref:
        raise ValueError(f"{what}={ref!r} is invalid: expected module:function or file.py:function")
    mod_name, _, attr = ref.rpartition(":")
    try:
        if mod_name.endswith(".py"):
            path = Path(mod_name)
            if not path.exists():
                raise FileNotFoundError(f"{what}: file {mod_name!r} does not exist")
            spec = importlib.util.spec_from_file_location(f"_ftlab_user_{path.stem}", path)
            if spec is None or spec.loader is None:
                raise ValueError(f"{what}: cannot load {mod_name!r} as a Python file")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(mod_name)
    except ImportError as exc:
        raise ValueError(f"{what}: cannot import {mod_name!r} ({exc})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"{what}: {mod_name!r} has no callable {attr!r}")
    return fn


def hf_loss(model, batch):
    """The loss a Hugging Face model computes from the batch's ``labels``."""
    out = model(**batch)
    if getattr(out, "loss", None) is None:
        raise ValueError("--loss hf: the model returned no loss (does the batch hold labels?)")
    return out.loss


def logits_loss(model, batch):
    """Cross-entropy of ``model(inputs)`` against the batch's labels (the default for plain models on labelled files)."""
    from torch.nn import functional as F

    x, y = batch
    return F.cross_entropy(model(x), y)


def build_model(arch: str | None, checkpoint: str, hf_class: str, role: str):
    """A model for ``checkpoint``: from an HF config folder or a ``module:function`` factory, then its weights."""
    from ftlab.transfer.io import load_state_dict

    ckpt = Path(checkpoint)
    if arch is None:
        if ckpt.is_dir() and (ckpt / "config.json").exists():
            arch = str(ckpt)
        else:
            flag = f"--{role.split()[0]}-arch"
            raise ValueError(f"{role}: {checkpoint!r} is not a Hugging Face folder; give its architecture with {flag}")
    if Path(arch).is_dir():
        if not (Path(arch) / "config.json").exists():
            raise FileNotFoundError(f"{role}: architecture folder {arch!r} has no config.json")
        import transformers

        config = transformers.AutoConfig.from_pretrained(arch, trust_remote_code=False)
        cls = getattr(transformers, hf_class, None)
        if cls is None:
            raise ValueError(f"--hf-class={hf_class!r} is not a class of transformers")
        model = cls.from_config(config, trust_remote_code=False) if hf_class.startswith("Auto") else cls(config)
    else:
        model = load_callable(arch, f"{role} architecture")()
    import torch

    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"{role}: the architecture factory returned {type(model).__name__}, not an nn.Module")
    state = load_state_dict(checkpoint)
    own = model.state_dict()
    missing = [k for k in own if k not in state and k in dict(model.named_parameters())]
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        raise ValueError(f"{role}: checkpoint {checkpoint!r} does not fit the architecture "
                         f"(missing {missing[:2]}, unexpected {unexpected[:2]})")
    for k, v in state.items():
        if own[k].shape != v.shape:
            raise ValueError(f"{role}: {k!r} has shape {tuple(v.shape)} in the checkpoint "
                             f"but {tuple(own[k].shape)} in the model")
    model.load_state_dict(state, strict=False)
    return model.eval()


def load_batches(ref: str, batch_size: int, max_batches: int | None):
    """Calibration batches from a tensor file (dict of equal-length tensors, split along dim 0) or a factory."""
    from ftlab.transfer.io import load_state_dict

    path = Path(ref)
    if path.suffix in (".safetensors", ".pt", ".pth", ".bin") or path.is_file():
        data = load_state_dict(path)
        if not data:
            raise ValueError(f"calibration file {ref!r} holds no tensors")
        sizes = {int(v.shape[0]) for v in data.values()}
        if len(sizes) != 1:
            raise ValueError(f"calibration file {ref!r}: tensors differ in their first dimension ({sorted(sizes)})")
        n = sizes.pop()
        batches = [{k: v[i:i + batch_size] for k, v in data.items()} for i in range(0, n, batch_size)]
    else:
        batches = list(load_callable(ref, "--data")())
    return _cap(batches, max_batches, ref)


def _cap(batches: list, max_batches: int | None, ref: str) -> list:
    if max_batches is not None:
        batches = batches[:max_batches]
    if not batches:
        raise ValueError(f"calibration data {ref!r} yielded no batches")
    return batches


def parse_floats(text: str | None, name: str, n: int = 3) -> tuple[float, ...] | None:
    """``"0.5,0.5,0.5"`` -> a tuple of ``n`` floats (``ValueError`` naming the option otherwise)."""
    if text is None:
        return None
    try:
        vals = tuple(float(x) for x in text.split(","))
    except ValueError:
        vals = ()
    if len(vals) != n:
        raise ValueError(f"{name}={text!r} is invalid: give {n} comma-separated numbers")
    return vals


@dataclass(frozen=True)
class Calibration:
    """Paired calibration batches: ``batches`` for both models, or ``source``/``target`` for each."""

    batches: list | None = None
    source: list | None = None
    target: list | None = None
    labelled_file: bool = False

    def kwargs(self) -> dict[str, Any]:
        if self.batches is not None:
            return {"batches": self.batches}
        return {"source_batches": self.source, "target_batches": self.target}


def _tokenizer_folder(explicit: str | None, model_folder: str, role: str) -> str:
    if explicit is not None:
        return explicit
    if Path(model_folder).is_dir():
        return model_folder
    raise ValueError(f"text calibration data: the {role} ({model_folder!r}) is not a folder with a tokenizer; give "
                     f"--{role.split()[0]}-tokenizer")


def calibration_data(a: dict, *, source_folder: str, target_folder: str) -> Calibration | None:
    """The calibration batches of a command line (``a`` holds its calibration options)."""
    from ftlab.transfer import datafiles

    ref, n_max = a["data"], a["max_samples"]
    if ref is None:
        return None
    path = Path(ref)
    if path.suffix.lower() in datafiles.TEXT_SUFFIXES:
        toks = [datafiles.load_tokenizer(_tokenizer_folder(a["source_tokenizer"], source_folder, "source base")),
                datafiles.load_tokenizer(_tokenizer_folder(a["target_tokenizer"], target_folder, "target base"))]
        src, tgt = datafiles.text_batches(path, toks, text_column=a["text_column"], pair_column=a["text_pair_column"],
                                          label_column=a["label_column"] or None, batch_size=a["batch_size"],
                                          max_length=a["max_length"], max_rows=n_max)
        return Calibration(source=_cap(src, a["max_batches"], ref), target=_cap(tgt, a["max_batches"], ref),
                           labelled_file=bool(a["label_column"]))
    if path.is_dir():
        mean, std = parse_floats(a["image_mean"], "--image-mean"), parse_floats(a["image_std"], "--image-std")
        pre = [datafiles.image_preprocessing(folder, size=size, mean=mean, std=std)
               for folder, size in ((source_folder, a["image_size"]),
                                    (target_folder, a["target_image_size"] or a["image_size"]))]
        isrc, itgt = datafiles.image_folder_batches(path, pre, batch_size=a["batch_size"], max_images=n_max)
        if pre[0] == pre[1]:
            return Calibration(batches=_cap(isrc, a["max_batches"], ref), labelled_file=True)
        return Calibration(source=_cap(isrc, a["max_batches"], ref), target=_cap(itgt, a["max_batches"], ref),
                           labelled_file=True)
    batches = load_batches(ref, a["batch_size"], a["max_batches"])
    if a["target_data"] is not None:
        return Calibration(source=batches, target=load_batches(a["target_data"], a["batch_size"], a["max_batches"]))
    return Calibration(batches=batches)


def default_loss(loss_ref: str | None, model, cal: Calibration | None):
    """The loss of a command line: ``--loss`` when given; for labelled files the model's own (Hugging Face) or the
    cross-entropy of its outputs (plain models); else None."""
    if loss_ref == "hf":
        return hf_loss
    if loss_ref is not None:
        return load_callable(loss_ref, "--loss")
    if cal is None or not cal.labelled_file:
        return None
    return hf_loss if hasattr(model, "config") else logits_loss
