"""What ``ftlab transfer`` reads: models, the source fine-tuning, calibration data and the loss."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Calibration", "calibration_data", "check_input_files", "default_loss", "hf_loss", "logits_loss",
           "num_labels_for", "parse_floats", "with_fresh_heads", "with_tokenizer_vocab_map"]


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


def _file_batches(a: dict, ref: str, sides: list[tuple[str, str]], n_max: int | None,
                  trust_remote_code: bool) -> list[list] | None:
    """Batches of a text file or an image folder for each ``(role, model folder)`` in ``sides`` (read with that
    model's tokenizer or preprocessing; one list for all sides where their image preprocessing is the same), or
    None for a tensor file."""
    from ftlab.transfer import datafiles

    path = Path(ref)
    if path.suffix.lower() in datafiles.TEXT_SUFFIXES:
        toks = [datafiles.load_tokenizer(_tokenizer_folder(a[f"{who}_tokenizer"], folder, f"{who} base"),
                                         trust_remote_code=trust_remote_code) for who, folder in sides]
        return datafiles.text_batches(path, toks, text_column=a["text_column"], pair_column=a["text_pair_column"],
                                      label_column=a["label_column"] or None, batch_size=a["batch_size"],
                                      max_length=a["max_length"], max_rows=n_max)
    if path.is_dir():
        mean, std = parse_floats(a["image_mean"], "--image-mean"), parse_floats(a["image_std"], "--image-std")
        sizes = {"source": a["image_size"], "target": a["target_image_size"] or a["image_size"]}
        pre = [datafiles.image_preprocessing(folder, size=sizes[who], mean=mean, std=std) for who, folder in sides]
        if all(p == pre[0] for p in pre):
            pre = pre[:1]  # one list of batches serves every side
        return datafiles.image_folder_batches(path, pre, batch_size=a["batch_size"], max_images=n_max)
    return None


def calibration_data(a: dict, *, source_folder: str, target_folder: str, trust_remote_code: bool = False
                     ) -> Calibration | None:
    """The calibration batches of a command line (``a`` holds its calibration options)."""
    from ftlab.transfer import datafiles
    from ftlab.transfer.io import load_batches

    ref = a["data"]
    if ref is None:
        return None
    sides = [("source", source_folder), ("target", target_folder)]
    both = _file_batches(a, ref, sides, a["max_samples"], trust_remote_code)
    if both is not None:
        capped = [_cap(b, a["max_batches"], ref) for b in both]
        labelled = bool(a["label_column"]) or Path(ref).suffix.lower() not in datafiles.TEXT_SUFFIXES
        if len(capped) == 1:  # images preprocessed alike for both models
            return Calibration(batches=capped[0], labelled_file=labelled)
        return Calibration(source=capped[0], target=capped[1], labelled_file=labelled)
    batches = load_batches(ref, a["batch_size"], a["max_batches"])
    if a["target_data"] is not None:
        return Calibration(source=batches, target=load_batches(a["target_data"], a["batch_size"], a["max_batches"],
                                                               what="--target-data"))
    return Calibration(batches=batches)


def head_data_batches(a: dict, *, target_folder: str, trust_remote_code: bool = False) -> list:
    """B's batches of ``--head-data``, read like ``--data`` with B's tokenizer or preprocessing alone; every row (no
    ``--max-samples`` / ``--max-batches`` cap: they limit the calibration pass)."""
    from ftlab.transfer.io import load_batches

    ref = a["head_data"]
    read = _file_batches(a, ref, [("target", target_folder)], None, trust_remote_code)
    out = read[0] if read is not None else load_batches(ref, a["batch_size"], None, what="--head-data")
    if not out:
        raise ValueError(f"--head-data {ref!r} holds no rows")
    return out


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


def with_fresh_heads(opts, loaded: list[dict], target):
    """``opts`` with the task heads the loader had to initialise (a base folder loaded with a task class, see
    :func:`ftlab.transfer.io.hf_checkpoint_keys`) among the new heads, when ``new_heads`` holds ``auto``."""
    import dataclasses

    if "auto" not in opts.new_heads:
        return opts
    names = {n for n, _ in target.named_modules()}
    fresh = sorted({p.rpartition(".")[0] for rep in loaded for p in rep.get("fresh", ())} & names)
    add = tuple(n for n in fresh if n not in opts.new_heads)
    return dataclasses.replace(opts, new_heads=opts.new_heads + add) if add else opts


def with_tokenizer_vocab_map(opts, a: dict, source, target, *, source_folder: str, target_folder: str,
                             trust_remote_code: bool = False):
    """``opts`` with a ``vocab_map`` built from the two models' tokenizers
    (:func:`ftlab.transfer.automap.vocab_map_from_tokenizers`) when the calibration data are texts, no
    ``--vocab-map`` is given and the two input embedding tables differ in rows (MiniLM's 30522 vs MPNet's 30527)."""
    import dataclasses

    from ftlab.transfer import datafiles
    from ftlab.transfer.automap import vocab_map_from_tokenizers

    if opts.vocab_map is not None or a.get("data") is None or Path(a["data"]).suffix.lower() not in datafiles.TEXT_SUFFIXES:
        return opts
    get = [getattr(m, "get_input_embeddings", None) for m in (source, target)]
    rows = [getattr(g(), "num_embeddings", None) if callable(g) else None for g in get]
    n_a, n_b = rows
    if not isinstance(n_a, int) or not isinstance(n_b, int) or n_a == n_b:
        return opts
    toks = [datafiles.load_tokenizer(_tokenizer_folder(a[f"{who}_tokenizer"], folder, f"{who} base"),
                                     trust_remote_code=trust_remote_code)
            for who, folder in (("source", source_folder), ("target", target_folder))]
    return dataclasses.replace(opts, vocab_map=vocab_map_from_tokenizers(toks[0], toks[1], n_b))


def num_labels_for(folder: str | None, explicit: int | None, a: dict) -> int | None:
    """The ``num_labels`` a task class is built with from ``folder``: ``--num-labels`` when given; else, for a Hugging
    Face folder whose ``config.json`` names no labels (a base model saved as ``BertModel``), the number of classes
    of the labelled calibration data (a text table's largest label + 1, an image folder's class folders); else
    None (the config's own)."""
    import json

    from ftlab.transfer import datafiles

    if explicit is not None:
        return explicit
    cfg = Path(folder) / "config.json" if folder is not None else None
    if cfg is None or not cfg.is_file():
        return None
    try:
        if "id2label" in json.loads(cfg.read_text(encoding="utf-8")):
            return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # the loader reports an unreadable config
    ref, column = a.get("data"), a.get("label_column")
    if ref is None:
        return None
    path = Path(ref)
    if path.suffix.lower() in datafiles.TEXT_SUFFIXES and column:
        rows = datafiles.read_records(path)
        labels = [r[column] for r in rows if isinstance(r.get(column), int) and not isinstance(r.get(column), bool)]
        return max(labels) + 1 if labels else None
    if path.is_dir():
        classes = [p for p in path.iterdir() if p.is_dir()]
        return len(classes) or None
    return None
