"""What ``ftlab transfer`` writes: the target model or a LoRA adapter, the task vector, the report.

Every file is written into a staging folder and the set appears in ``--out`` only when all of it is
written (:func:`ftlab.core.results.staged_output`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

__all__ = ["LOW_ESTIMATE_ADVICE", "TOKENIZER_FILES", "rank_advice", "write_diagnosis", "write_full", "write_lora_output"]

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


def write_lora_output(out: Path, *, result, target, alpha: float, max_rank: int | None, report: dict,
                      target_folder: str | None, heal=None) -> tuple[list[str], dict]:
    """A PEFT LoRA adapter for the target that computes ``result.model(target, alpha)``
    (:func:`ftlab.transfer.adapters.write_transfer_adapter`: ``alpha tau_B``, repaired statistics, new heads),
    healed when ``heal = (recipe, target batches, loss, which rows)`` is given (:mod:`ftlab.transfer.heal`), the target's
    tokenizer files and ``report.json`` with each module's rank and truncation error; returns the names and the
    adapter report."""
    from ftlab.core.progress import stage as stage_line
    from ftlab.core.results import save_json, staged_output
    from ftlab.transfer.adapters import write_transfer_adapter

    _json_checked(report)
    with stage_line("writing"), staged_output(out, name="transfer") as stage:
        base_name = str(Path(target_folder).resolve()) if target_folder and Path(target_folder).is_dir() else None
        lora = write_transfer_adapter(stage, result, target, alpha=alpha, max_rank=max_rank, base_name=base_name)
        if heal is not None:
            from ftlab.transfer.heal import heal_adapter, save_healed

            recipe, batches, loss, rows = heal
            with stage_line(f"healing ({recipe.steps} steps)"):
                save_healed(heal_adapter(target, stage, batches, loss, recipe), stage)
            lora["heal"] = {"steps": recipe.steps, "lr": recipe.lr, "optimizer": recipe.optimizer,
                            "batches": len(batches), "data": rows}
        files = ["adapter_config.json", "adapter_model.safetensors", *_copy_tokenizer(target_folder, stage)]
        save_json(stage / "report.json", {**report, "adapter": lora, "files": files + ["report.json"]})
    return files + ["report.json"], lora


#: What to try when the estimated carried share is low (appended to the note).
LOW_ESTIMATE_ADVICE = ("to try: more calibration data (--data, --max-samples), alpha chosen on held-out data "
                       "(search_alpha in Python; --alpha), for a new task head the task's labelled training rows "
                       "(--head-data), "
                       "and for BatchNorm targets the statistics repair (--repair, on by default)")


def rank_advice(result, options) -> str:
    """One line on the maps the calibration rows leave partly undetermined, and what would determine them."""
    fits = [f for pair in result.fits.values() for f in {id(x): x for x in pair if x is not None}.values() if f.note]
    short = [f for f in fits if f.n_rows < f.dims]
    line = (f"{len(fits)} maps are determined on fewer dimensions than their width (the completion rule fixed the "
            "rest; rank_notes in report.json)")
    if short:
        widest = max(f.dims for f in short)
        rows = min(f.n_rows for f in short)
        one_row = options.seq_align in ("mean", "cls")
        line += (f"; {len(short)} of them saw fewer rows than their width (as few as {rows} rows for widths up to "
                 f"{widest}): at least {widest} calibration rows would determine them (more --data or "
                 "--max-samples" + ("; --seq-align identity uses every token as a row, mean and cls one per text"
                                    if one_row else "") + ")")
    if len(short) < len(fits):
        line += (f"; {len(fits) - len(short)} are short of rank with enough rows (e.g. gradients of a normalised "
                 "stream, a head over few classes): more data does not fix these, the completion rule does")
    return line


def write_diagnosis(out: Path, report: dict) -> None:
    """``diagnosis.json`` alone."""
    from ftlab.core.results import save_json, staged_output

    _json_checked(report)
    with staged_output(out, name="diagnosis") as stage:
        save_json(stage / "diagnosis.json", report)
