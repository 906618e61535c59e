"""``ftlab transfer``: carry a fine-tuning from one base model to another, without training."""

from __future__ import annotations

import dataclasses
import json
import math
import time
import warnings
from pathlib import Path

import click

from ftlab.cli.transfer_inputs import (
    calibration_data,
    check_input_files,
    default_loss,
    head_data_batches,
    num_labels_for,
    with_fresh_heads,
    with_tokenizer_vocab_map,
)
from ftlab.cli.transfer_outputs import LOW_ESTIMATE_ADVICE, rank_advice, write_diagnosis, write_full, write_lora_output
from ftlab.transfer.align import RankWarning
from ftlab.transfer.methods import list_methods, method_names, option_help, reads_batches
from ftlab.transfer.options import TransferOptions, cli_fields, parse_cli_value


def _methods_epilog() -> str:
    """The method list for ``--help``, built from the registry (the only list of methods and options)."""
    lines = ["\b", "Methods (--method) and their options (--method-option KEY=VALUE):"]
    for info in list_methods():
        lines.append(f"  {info.name}: {info.description}")
        lines.append(f"      needs {info.needs}; ref. {info.reference}")
        opts = ", ".join(f"{k}={d}" for k, _, d in option_help(info) if k not in info.preset)
        if opts:
            lines.append(f"      options: {opts}")
    return "\n".join(lines)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def transfer_options(fn):
    """Add one command-line option per :class:`~ftlab.transfer.options.TransferOptions` field (help and
    choices from the field; unset options keep the library's defaults)."""
    for f in reversed(cli_fields()):
        kind, help_text = f.metadata["cli"], f.metadata["help"][:1].upper() + f.metadata["help"][1:] + "."
        default = f.default if f.default is not dataclasses.MISSING else None
        if kind == "flag":
            deco = click.option(f"{_flag(f.name)}/{_flag('no_' + f.name)}", f.name, default=None,
                                help=f"{help_text} [default: {'on' if default else 'off'}]")
        elif kind == "choice":
            deco = click.option(_flag(f.name), f.name, type=click.Choice(f.metadata["choices"]), default=None,
                                help=f"{help_text} [default: {default}]")
        else:
            shown = ",".join(default or ()) if kind == "globs" else default
            metavar = {"int": "INT", "float": "NUMBER", "globs": "GLOBS", "json": "JSON|FILE", "str": "TEXT"}[kind]
            deco = click.option(_flag(f.name), f.name, default=None, metavar=metavar,
                                help=help_text if shown is None else f"{help_text} [default: {shown}]")
        fn = deco(fn)
    return fn


def build_options(values: dict, record_file: str | None) -> TransferOptions:
    """The :class:`~ftlab.transfer.options.TransferOptions` of a command line: a recorded run's options
    (``--options-from``) if given, then every option set on the command line."""
    given = {}
    for f in cli_fields():
        raw = values.get(f.name)
        if raw is None:
            continue
        given[f.name] = parse_cli_value(f, raw) if isinstance(raw, str) and f.metadata["cli"] != "choice" else raw
    if record_file is None:
        return TransferOptions(**given)
    try:
        rec = json.loads(Path(record_file).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"--options-from {record_file!r} is not a readable JSON run record ({exc})") from None
    opts = rec.get("options", {}).get("transfer") if isinstance(rec, dict) else None
    if not isinstance(opts, dict):
        raise ValueError(f"--options-from {record_file!r}: no transfer options recorded (options.transfer)")
    return TransferOptions.from_record(opts, **given)


def parse_method_options(items: tuple[str, ...]) -> dict:
    """``("center=true", "whiten_p=0.25")`` -> ``{"center": True, "whiten_p": 0.25}`` (bools, ints, floats, strings)."""
    out: dict = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--method-option {item!r} is invalid: expected KEY=VALUE")
        low = raw.strip().lower()
        value: object
        if low in ("true", "false"):
            value = low == "true"
        else:
            try:
                value = int(raw)
            except ValueError:
                try:
                    value = float(raw)
                except ValueError:
                    value = raw
        out[key.strip().replace("-", "_")] = value
    return out


@click.command("transfer", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
               epilog=_methods_epilog())
@click.option("--source-base", required=True,
              help="Checkpoint of the source base model A (safetensors, weights-only .pt, or HF folder).")
@click.option("--source-finetuned", required=True, help="A fine-tuned on the task: a checkpoint (as --source-base) or "
              "a PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors) made for A.")
@click.option("--target-base", required=True, help="Checkpoint of the target base model B.")
@click.option("--source-arch", default=None, help="A's architecture: HF config folder or module:function factory "
              "(default: the checkpoint folder itself).")
@click.option("--target-arch", default=None, help="B's architecture (same forms as --source-arch).")
@click.option("--hf-class", default="AutoModel", show_default=True,
              help="transformers class for HF config folders, e.g. BertForSequenceClassification; a folder of the "
                   "base model (saved as BertModel) loads into a task class as transformers loads it (the head is "
                   "then new).")
@click.option("--num-labels", type=int, default=None, help="Labels of the task class (--hf-class); default: the "
              "folder's config, or for a base folder whose config names none, the classes in the labelled --data.")
@click.option("--data", "data", default=None, help="Calibration data: a text table (.jsonl/.csv/.tsv: --text-column, "
              "--label-column), a folder of images with one sub-folder per class, a .safetensors/.pt file of "
              "equal-length tensors (batched as dicts along dim 0), or a module:function returning batches.")
@click.option("--target-data", default=None, help="Separate calibration data for B (tensor files and factories: the "
              "same samples with B's preprocessing).")
@click.option("--head-data", default=None, help="Labelled data (same forms as --data, read for B alone) on which a task "
              "head new in both bases is refitted instead of the calibration data, e.g. the task's training texts: "
              "each row costs one forward pass of B and enters no map statistics.")
@click.option("--text-column", default="text", show_default=True, help="Text tables: the column of texts.")
@click.option("--text-pair-column", default=None, help="Text tables: a second text column (pairs of texts).")
@click.option("--label-column", default="label", show_default=True,
              help="Text tables: the column of integer class labels ('' for none: then give --loss).")
@click.option("--max-length", type=int, default=128, show_default=True, help="Text tables: tokens per example at most.")
@click.option("--source-tokenizer", default=None, help="Text tables: folder of A's tokenizer (default: A's folder).")
@click.option("--target-tokenizer", default=None, help="Text tables: folder of B's tokenizer (default: B's folder).")
@click.option("--image-size", type=int, default=None, help="Image folders: side in pixels (default: the model folder's "
              "preprocessor_config.json, else 224).")
@click.option("--target-image-size", type=int, default=None, help="Image folders: B's side, when it differs from A's.")
@click.option("--image-mean", default=None, help="Image folders: per-channel mean, e.g. 0.485,0.456,0.406 (ImageNet's "
              "is the default).")
@click.option("--image-std", default=None, help="Image folders: per-channel std, e.g. 0.229,0.224,0.225.")
@click.option("--max-samples", type=int, default=None, help="Text rows or images to use at most (images drawn at "
              "random, seed 0).")
@click.option("--loss", "loss_ref", default=None, help="module:function or file.py:function computing loss(model, batch); "
              "'hf' uses model(**batch).loss. Default with a labelled text table or an image folder: the model's own "
              "loss (Hugging Face) or the cross-entropy of its outputs.")
@click.option("--method", type=click.Choice(method_names()), default="bico", show_default=True,
              help="Transfer method (listed below with their options).")
@click.option("--method-option", "-o", "method_options", multiple=True, metavar="KEY=VALUE",
              help="An option of the method, e.g. -o center=true -o whiten_p=0.25 (repeatable; see below).")
@click.option("--alpha", type=float, default=1.0, show_default=True, help="Scale of the transported task vector, in "
              "every output form (a LoRA output holds alpha tau_B, its modules_to_save base + alpha delta).")
@click.option("--heal-steps", type=int, default=0, show_default=True, help="LoRA output: train the written adapter "
              "this many steps on labelled rows (--heal-data; cycled in order; ftlab's short heal, "
              "ftlab.transfer.heal); 0: no training. On a held-out text task 50 steps lowered the adapter on "
              "the 100 calibration texts and did not raise it on the 1,200 training texts (docs/lora-transfer.md): "
              "judge a healed adapter on held-out data.")
@click.option("--heal-lr", type=float, default=1e-3, show_default=True, help="Learning rate of the heal (AdamW).")
@click.option("--heal-data", type=click.Choice(["auto", "data", "head-data"]), default="auto", show_default=True,
              help="Rows the heal trains on: data (the calibration file), head-data (the --head-data file) or auto "
                   "(head-data when --head-data is given, else data).")
@click.option("--batch-size", type=int, default=32, show_default=True, help="Rows per calibration batch.")
@click.option("--max-batches", type=int, default=None, help="Use at most this many calibration batches.")
@click.option("--out-format", type=click.Choice(["full", "lora"]), default=None,
              help="full: B + alpha tau_B as model.safetensors; lora: a PEFT LoRA adapter for B (loadable with "
                   "PeftModel.from_pretrained). Default: lora when --source-finetuned is an adapter, else full.")
@click.option("--lora-rank", type=int, default=None, help="LoRA output: truncate each module at this rank (default: "
              "the rank each module has; the truncation error per module goes into report.json).")
@click.option("--options-from", "options_from", default=None, type=click.Path(dir_okay=False),
              help="Start from the transfer options recorded in an earlier run's report.json (options given on this "
                   "command line replace recorded ones).")
@click.option("--diagnose", "diagnose_only", is_flag=True, default=False,
              help="Do not transfer: report per layer how well A and B align (Procrustes similarity, map ranks; "
                   "with --diagnostics also CKA of activations and gradients) and estimate the share of the task "
                   "vector that will carry over, from the fit's own statistics (one calibration pass, at most the "
                   "transfer's time and memory); writes diagnosis.json into --out.")
@click.option("--trust-remote-code", is_flag=True, default=False,
              help="Run the Python code a Hugging Face folder names (config.json's auto_map) to build its model or "
                   "tokenizer. Off by default: such a folder is refused, and no code that comes with an input runs.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Output folder (it may not be, contain or lie inside an input).")
@transfer_options
def transfer(**a):
    """Transfer a task vector from base model A to base model B without training (BiCo, arXiv 2605.28444).

    Runs A and B once (forward + backward) over the calibration data, fits per layer an
    orthogonal Procrustes map on input activations and one on output gradients, maps
    tau_A = A_ft - A onto B's parameters, and writes into --out:

    \b
      model.safetensors        B's weights + alpha * tau_B (--out-format full), with config.json
                               and the tokenizer files of a Hugging Face target; BatchNorm
                               statistics re-pinned on the calibration data (--repair, ftlab's)
      adapter_config.json,     a PEFT LoRA adapter holding tau_B (--out-format lora)
      adapter_model.safetensors
      task_vector.safetensors  tau_B itself (full output; apply another alpha later; without
                               the repair, which depends on alpha)
      report.json              per layer: map shapes, ranks, norms (with --diagnostics: CKA and
                               alignment residuals); time and peak memory; "diagnostic": the
                               estimated share of the task vector that carries over and ftlab's rule

    Nothing is written unless the whole transfer succeeds. Before anything is written, one line on
    stderr gives the estimated share of the task vector that carries over (with what to try when it
    is low); it estimates alignment, not accuracy -- on ftlab's benchmark it did not tell harmful
    transfers from helpful ones -- so check the result on held-out data. With --diagnose, nothing
    is transferred: diagnosis.json holds per layer the alignment of A and B and the estimate (see
    docs/transfer.md, "Before trusting a transfer").

    \b
    Examples:
      # a shared LoRA adapter of A and a JSONL file of texts and labels -> a LoRA adapter for B
      ftlab transfer --source-base minilm --source-finetuned minilm-lora \\
          --target-base mpnet --hf-class AutoModelForSequenceClassification \\
          --data texts.jsonl --seq-align mean --out out/
      # Hugging Face folders, calibration tensors, loss from the model's labels
      ftlab transfer --source-base bert-small --source-finetuned bert-small-sst2 \\
          --target-base bert-wide --hf-class BertForSequenceClassification \\
          --data calib.safetensors --loss hf --out out/
      # plain PyTorch: factories, a folder of images (one sub-folder per class)
      ftlab transfer --source-base a.safetensors --source-finetuned a_ft.safetensors \\
          --target-base b.safetensors --source-arch mymodels.py:small --target-arch mymodels.py:wide \\
          --data images/ --image-size 64 --alpha 0.8 --out out/
    """
    from ftlab.core.validate import check_finite, check_int
    from ftlab.transfer import get_method

    check_finite("alpha", a["alpha"])
    check_int("heal_steps", a["heal_steps"], 0)
    check_finite("heal_lr", a["heal_lr"])
    for name in ("batch_size", "max_batches", "max_length", "max_samples", "lora_rank", "image_size",
                 "target_image_size", "num_labels"):
        if a.get(name) is not None:
            check_int(name, a[name], 1)
    m = get_method(a["method"], **parse_method_options(a["method_options"]))  # validate before loading any model
    opts = build_options(a, a["options_from"])
    if a["head_data"] is not None and a["data"] is None:
        raise ValueError("--head-data refits a new task head beside a calibrated transfer: give --data too")
    a["heal_data"] = heal_rows(a["heal_data"], a["head_data"] is not None)  # "data" or "head-data" from here on
    if a["diagnose_only"] and m.calibration != "maps":
        raise ValueError(f"--diagnose needs a method that fits maps (e.g. bico), not {a['method']}")
    from ftlab.core.results import check_output_place, output_lock

    check_output_place(a["out_dir"], _input_paths(a))  # before any work: inputs are never written over
    check_input_files([a["source_base"], a["source_finetuned"], a["target_base"]],
                      [a["data"], a["target_data"], a["head_data"]])
    with output_lock(a["out_dir"]):  # a second run on the same --out is refused, not interleaved
        _run(a, m, opts)


def _input_paths(a: dict) -> dict[str, str]:
    """The run's inputs that are files or folders (a ``file.py:function`` by its file)."""
    import os

    out = {}
    for key in ("source_base", "source_finetuned", "target_base", "source_arch", "target_arch", "data", "target_data",
                "head_data", "source_tokenizer", "target_tokenizer", "options_from", "loss_ref"):
        ref = a.get(key)
        if not isinstance(ref, str):
            continue
        path = ref if os.path.exists(ref) else ref.rpartition(":")[0]
        if path and os.path.exists(path):
            out["--loss" if key == "loss_ref" else "--" + key.replace("_", "-")] = path
    return out


def _expectation(fit):
    """ftlab's rule (:func:`ftlab.transfer.diagnose.expectation`) on a finished fit or a diagnosis, read off the
    fit's own statistics (no second pass); None where it has nothing to read: a method that fits no maps (naive,
    transfusion) or a zero task vector (no finite estimate)."""
    from ftlab.transfer.diagnose import Diagnosis, diagnosis_from_result, expectation

    if not isinstance(fit, Diagnosis):
        if not fit.pairs:
            return None
        fit = diagnosis_from_result(fit)
    return expectation(fit) if math.isfinite(fit.estimate) else None


def _diagnose_only(A, A_ft, B, loss, m, opts, kw: dict, out: Path, head: dict, t0: float) -> None:
    """``--diagnose``: the fit's own statistics (one calibration pass and the solves, without the transport and
    the repair: at most the transfer's cost; CKA only with --diagnostics), written to diagnosis.json with ftlab's
    rule."""
    from ftlab.transfer import diagnose

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RankWarning)  # the ranks are in diagnosis.json, layer by layer
        diag = diagnose(A, A_ft, B, loss=loss, method=m, options=opts, cka=opts.diagnostics, **kw)
    rule = _expectation(diag)
    write_diagnosis(out, {**head, **diag.report(), "diagnostic": rule.record() if rule else None,
                          "total_time_s": time.perf_counter() - t0})
    click.echo(diag.summary())
    if rule is not None:
        click.echo(rule.message())
    click.echo(f"ftlab transfer --diagnose: wrote {out}/diagnosis.json")


def _run(a: dict, m, opts) -> None:
    """Load, calibrate and fit, then write (the body of ``ftlab transfer``; ``a`` holds its command line)."""
    from ftlab import __version__
    from ftlab.transfer import fit_transfer
    from ftlab.transfer.batches import CalibrationData
    from ftlab.transfer.heads import heads_summary
    from ftlab.transfer.lora import is_adapter_folder

    t0 = time.perf_counter()
    fmt = a["out_format"] or ("lora" if is_adapter_folder(a["source_finetuned"]) else "full")
    trust = a["trust_remote_code"]
    A, A_ft, B, opts = _load_models(a, opts)
    cal = calibration_data(a, source_folder=a["source_arch"] or a["source_base"],
                           target_folder=a["target_arch"] or a["target_base"], trust_remote_code=trust)
    if reads_batches(m) and cal is None:
        raise ValueError(f"--method {m.name} needs calibration data: give --data")
    loss = default_loss(a["loss_ref"], A, cal)
    if reads_batches(m) and m.needs_loss and loss is None:
        raise ValueError(f"--method {m.name} fits maps on gradients and needs a loss: give --loss (activation_only runs "
                         "forward passes only)")
    kw = cal.kwargs() if cal is not None else {}
    if a["head_data"] is not None:
        kw["head_batches"] = head_data_batches(a, target_folder=a["target_arch"] or a["target_base"],
                                               trust_remote_code=trust)
    opts = with_tokenizer_vocab_map(opts, a, A, B, source_folder=a["source_arch"] or a["source_base"],
                                    target_folder=a["target_arch"] or a["target_base"], trust_remote_code=trust)
    if a["heal_steps"] and (fmt != "lora" or loss is None):
        raise ValueError("--heal-steps trains a LoRA adapter on the labelled calibration data: it needs --out-format "
                         "lora and a loss (labels in --data, or --loss)")
    inputs = {"source_base": a["source_base"], "source_finetuned": a["source_finetuned"], "target_base": a["target_base"],
              "data": a["data"], "head_data": a["head_data"], "loss": a["loss_ref"]}
    out = Path(a["out_dir"])
    if a["diagnose_only"]:
        _diagnose_only(A, A_ft, B, loss, m, opts, kw, out, {"ftlab_version": __version__, "inputs": inputs}, t0)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RankWarning)  # every map's note goes into report.json (rank_notes)
        res = fit_transfer(A, A_ft, B, loss=loss, method=m, options=opts, **kw)
    notes = [f.note for pair in res.fits.values() for f in {id(x): x for x in pair if x is not None}.values() if f.note]
    rule = _expectation(res)
    if rule is not None:  # said before anything is written; the transfer goes on
        click.echo(f"ftlab transfer: {rule.message()}" + (f"; {LOW_ESTIMATE_ADVICE}" if rule.below else ""), err=True)
    report = {"ftlab_version": __version__, "inputs": inputs, "alpha": a["alpha"], "out_format": fmt, **res.report(),
              "diagnostic": rule.record() if rule else None, "rank_notes": notes,
              "total_time_s": time.perf_counter() - t0}
    heal_batches: list = []
    if a["heal_steps"]:
        heal_batches = list(kw["head_batches"]) if a["heal_data"] == "head-data" else \
            [bb for _, bb in CalibrationData(**{k: v for k, v in kw.items() if k != "head_batches"})]
    files, extra = _write(a, fmt, res, B, report, (heal_batches, loss, a["heal_data"]))
    click.echo(f"ftlab transfer: {m.name}, {res.n_batches} calibration batches, ||tau_A|| = "
               f"{res.source_norms['total']:.4g}, ||tau_B|| = {res.task_vector.norm():.4g}, alpha = {a['alpha']:g}"
               f"{extra}; wrote {out}/{', '.join(files)}")
    if res.heads is not None:
        click.echo(f"ftlab transfer: {heads_summary(res.heads)}", err=True)
    elif a["head_data"] is not None:
        click.echo("ftlab transfer: note: --head-data is unused: the source fine-tuning has no task head that is new "
                   "in both bases (a PEFT adapter's modules_to_save outside the base model)", err=True)
    if notes:
        click.echo(f"ftlab transfer: note: {rank_advice(res, opts)}", err=True)


def _load_models(a: dict, opts):
    """``(A, A_ft, B, opts)``: the three models of the command line (A's fine-tune stays a folder when it is a PEFT
    adapter), and ``opts`` with the task heads the loader had to initialise among the new heads."""
    from ftlab.core.progress import stage
    from ftlab.transfer.io import load_model
    from ftlab.transfer.lora import is_adapter_folder

    trust = a["trust_remote_code"]
    loaded: list[dict] = [{}, {}]  # what loading each base did (a task head it had to initialise)
    with stage("loading models"):
        n_a = num_labels_for(a["source_arch"] or a["source_base"], a["num_labels"], a)
        n_b = num_labels_for(a["target_arch"] or a["target_base"], a["num_labels"], a)
        A = load_model(a["source_arch"], a["source_base"], hf_class=a["hf_class"], role="source base",
                       trust_remote_code=trust, report=loaded[0], num_labels=n_a)
        A_ft = a["source_finetuned"] if is_adapter_folder(a["source_finetuned"]) else \
            load_model(a["source_arch"], a["source_finetuned"], hf_class=a["hf_class"], role="source finetuned",
                       trust_remote_code=trust, num_labels=n_a)
        B = load_model(a["target_arch"], a["target_base"], hf_class=a["hf_class"], role="target base",
                       trust_remote_code=trust, report=loaded[1], num_labels=n_b)
    return A, A_ft, B, with_fresh_heads(opts, loaded, B)


def heal_rows(choice: str, has_head_data: bool) -> str:
    """The rows ``--heal-data`` names: ``"data"`` or ``"head-data"`` (``auto``: the --head-data rows when given)."""
    if choice == "head-data" and not has_head_data:
        raise ValueError("--heal-data head-data heals on the --head-data rows: give --head-data too")
    if choice == "auto":
        return "head-data" if has_head_data else "data"
    return choice


def _write(a: dict, fmt: str, res, B, report: dict, heal: tuple[list, object, str]) -> tuple[list[str], str]:
    """Write ``--out`` in form ``fmt`` (``B`` is changed in place for the full form); returns the file names and
    the summary's tail. ``heal``: the target's batches to heal on, the loss and which rows they are (``data`` or
    ``head-data``; used with ``--heal-steps``)."""
    import torch

    from ftlab.core.progress import stage
    from ftlab.transfer.heal import HealRecipe

    target_folder = a["target_base"] if Path(a["target_base"]).is_dir() else None
    if fmt == "lora":
        recipe = (HealRecipe(a["heal_steps"], lr=a["heal_lr"]), heal[0], heal[1], heal[2]) if a["heal_steps"] \
            else None
        files, lora = write_lora_output(Path(a["out_dir"]), result=res, target=B, alpha=a["alpha"],
                                        max_rank=a["lora_rank"], report=report, target_folder=target_folder,
                                        heal=recipe)
        worst = max((mm["truncation_error"] for mm in lora["modules"].values()), default=0.0)
        return files, (f", adapter rank {lora['rank']} (largest truncation error {worst:.1e})"
                       + (f", healed {a['heal_steps']} steps on the {heal[2]} rows" if recipe else ""))
    model = res.task_vector.apply_(B, a["alpha"])  # B was loaded here, so in place is safe
    extra = ""
    if res.repair is not None and a["alpha"] != 0:
        with stage("statistics repair"):
            repaired = res.repair.apply_(model)
        report["repair"] = {"mode": res.repair.mode, "alpha": a["alpha"], "layers": repaired}
        extra = f", {len(repaired)} norm layers' statistics repaired ({res.repair.mode})"
    if res.heads is not None:
        res.heads.apply_(model)
    bad = [k for k, v in model.state_dict().items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise ValueError(f"the transferred weights are not finite at {bad[0]!r}")
    return write_full(Path(a["out_dir"]), tau=res.task_vector, model=model, alpha=a["alpha"], report=report,
                      target_folder=target_folder), extra
