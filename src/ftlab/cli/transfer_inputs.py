"""What ``ftlab transfer`` reads: models, the source fine-tuning, calibration data and the loss."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Calibration", "calibration_data", "check_input_files", "default_loss", "hf_loss", "logits_loss",
           "parse_floats"]


def check_input_files(checkpoints: list[str], data: list[str | None]) -> None:
    """Refuse, before any work (and any stage line), the checkpoints and calibration tensor files the run would
    refuse later: missing, empty, pickled or unreadable (one line each, :func:`ftlab.transfer.io.check_checkpoint`).
    A PEFT adapter folder is checked by its weights file; text tables, image folders and factories are left to
    their readers."""
    from ftlab.transfer.io import check_checkpoint
    from ftlab.transfer.lora import WEIGHTS, is_adapter_folder

    for ref in checkpoints:
        if is_adapter_folder(ref):
            found = [Path(ref) / w for w in WEIGHTS if (Path(ref) / w).is_file()]
            if found:
                check_checkpoint(found[0])
        else:
            check_checkpoint(ref)
    for item in data:
        if item is not None and Path(item).suffix in (".safetensors", ".pt", ".pth", ".bin", ".ckpt"):
            check_checkpoint(item)


def hf_loss(model, batch):
    """The loss a Hugging Face model computes from the batch's ``labels``."""
    if not hasattr(model, "config") or not isinstance(batch, dict):
        raise ValueError("--loss hf needs a Hugging Face model and dict batches (input_ids, labels, ...); give "
                         "--loss module:function for other models")
    out = model(**batch)
    if getattr(out, "loss", None) is None:
        raise ValueError("--loss hf: the model returned no loss (does the batch hold labels?)")
    return out.loss


def logits_loss(model, batch):
    """Cross-entropy of ``model(inputs)`` against the batch's labels (the default for plain models on labelled files)."""
    from torch.nn import functional as F

    x, y = batch
    return F.cross_entropy(model(x), y)


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


def calibration_data(a: dict, *, source_folder: str, target_folder: str, trust_remote_code: bool = False
                     ) -> Calibration | None:
    """The calibration batches of a command line (``a`` holds its calibration options)."""
    from ftlab.transfer import datafiles
    from ftlab.transfer.io import load_batches

    ref, n_max = a["data"], a["max_samples"]
    if ref is None:
        return None
    path = Path(ref)
    if path.suffix.lower() in datafiles.TEXT_SUFFIXES:
        toks = [datafiles.load_tokenizer(_tokenizer_folder(a[f"{who}_tokenizer"], folder, f"{who} base"),
                                         trust_remote_code=trust_remote_code)
                for who, folder in (("source", source_folder), ("target", target_folder))]
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
        return Calibration(source=batches, target=load_batches(a["target_data"], a["batch_size"], a["max_batches"],
                                                               what="--target-data"))
    return Calibration(batches=batches)


def default_loss(loss_ref: str | None, model, cal: Calibration | None):
    """The loss of a command line: ``--loss`` when given; for labelled files the model's own (Hugging Face) or the
    cross-entropy of its outputs (plain models); else None."""
    if loss_ref == "hf":
        return hf_loss
    if loss_ref is not None:
        from ftlab.core.usercode import load_callable

        return load_callable(loss_ref, "--loss")
    if cal is None or not cal.labelled_file:
        return None
    return hf_loss if hasattr(model, "config") else logits_loss
