"""What ``ftlab transfer`` writes: the target model or a LoRA adapter, the task vector, the report.

Every file is written into a staging folder and the set appears in ``--out`` only when all of it is
written (:func:`ftlab.core.results.staged_output`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

__all__ = ["TOKENIZER_FILES", "write_diagnosis", "write_full", "write_lora_output"]

#: Tokenizer files copied from a Hugging Face target's folder, so that --out loads with its tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "vocab.json",
                   "merges.txt", "spiece.model", "sentencepiece.bpe.model", "added_tokens.json")


def _copy_tokenizer(target_folder: str | None, stage: Path) -> list[str]:
    if target_folder is None or not Path(target_folder).is_dir():
        return []
    copied = []
    for name in TOKENIZER_FILES:
        src = Path(target_folder) / name
        if src.is_file() and not src.is_symlink():
            shutil.copyfile(src, stage / name)
            copied.append(name)
    return copied


def _json_checked(report: dict) -> dict:
    from ftlab.core.results import to_jsonable

    json.dumps(to_jsonable(report))  # fail before writing anything if the report is not serialisable
    return report


def write_full(out: Path, *, tau, model, alpha: float, report: dict, target_folder: str | None) -> list[str]:
    """``model.safetensors`` (B + alpha tau_B), ``task_vector.safetensors``, ``config.json`` and the tokenizer of a
    Hugging Face target, ``report.json``; returns the file names."""
    from ftlab.core.progress import stage as stage_line
    from ftlab.core.results import atomic_write_text, save_json, staged_output
    from ftlab.transfer.io import save_state_dict

    _json_checked(report)
    with stage_line("writing"), staged_output(out, name="transfer") as stage:
        save_state_dict(stage / "task_vector.safetensors", tau.state_dict(), metadata={"format": "ftlab-task-vector"})
        save_state_dict(stage / "model.safetensors", model.state_dict(),
                        metadata={"format": "pt", "ftlab_alpha": str(alpha)})
        files = ["model.safetensors", "task_vector.safetensors"]
        config = getattr(model, "config", None)
        if config is not None and hasattr(config, "to_json_string"):  # make --out a loadable Hugging Face folder
            atomic_write_text(stage / "config.json", config.to_json_string())
            files += ["config.json", *_copy_tokenizer(target_folder, stage)]
        save_json(stage / "report.json", {**report, "files": files + ["report.json"]})
    return files + ["report.json"]


def write_lora_output(out: Path, *, tau, target, max_rank: int | None, report: dict,
                      target_folder: str | None) -> tuple[list[str], dict]:
    """A PEFT LoRA adapter for the target (``adapter_config.json``, ``adapter_model.safetensors``), the target's
    tokenizer files, ``report.json`` with each module's rank and truncation error; returns the names and the
    adapter report."""
    from ftlab.core.progress import stage as stage_line
    from ftlab.core.results import save_json, staged_output
    from ftlab.transfer.lora import write_lora

    _json_checked(report)
    with stage_line("writing"), staged_output(out, name="transfer") as stage:
        base_name = str(Path(target_folder).resolve()) if target_folder and Path(target_folder).is_dir() else None
        lora = write_lora(stage, tau, target, max_rank=max_rank, base_name=base_name)
        files = ["adapter_config.json", "adapter_model.safetensors", *_copy_tokenizer(target_folder, stage)]
        save_json(stage / "report.json", {**report, "adapter": lora, "files": files + ["report.json"]})
    return files + ["report.json"], lora


def write_diagnosis(out: Path, report: dict) -> None:
    """``diagnosis.json`` alone."""
    from ftlab.core.results import save_json, staged_output

    _json_checked(report)
    with staged_output(out, name="diagnosis") as stage:
        save_json(stage / "diagnosis.json", report)
