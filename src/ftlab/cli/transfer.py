"""``ftlab transfer``: carry a fine-tuning from one base model to another, without training."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import time
import warnings
from pathlib import Path

import click

from ftlab.transfer.methods import list_methods, method_names, option_help
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


def _hf_loss(model, batch):
    out = model(**batch)
    if getattr(out, "loss", None) is None:
        raise ValueError("--loss hf: the model returned no loss (does the batch hold labels?)")
    return out.loss


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

        config = transformers.AutoConfig.from_pretrained(arch)
        cls = getattr(transformers, hf_class, None)
        if cls is None:
            raise ValueError(f"--hf-class={hf_class!r} is not a class of transformers")
        model = cls.from_config(config) if hf_class.startswith("Auto") else cls(config)
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
    return model


def load_batches(ref: str, batch_size: int, max_batches: int | None):
    """Calibration batches from a tensor file (dict of equal-length tensors, split along dim 0) or a factory."""
    from ftlab.transfer.io import load_state_dict

    path = Path(ref)
    if path.suffix in (".safetensors", ".pt", ".pth", ".bin") or path.exists():
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
    if max_batches is not None:
        batches = batches[:max_batches]
    if not batches:
        raise ValueError(f"calibration data {ref!r} yielded no batches")
    return batches


@click.command("transfer", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
               epilog=_methods_epilog())
@click.option("--source-base", required=True,
              help="Checkpoint of the source base model A (safetensors, weights-only .pt, or HF folder).")
@click.option("--source-finetuned", required=True, help="Checkpoint of A fine-tuned on the task.")
@click.option("--target-base", required=True, help="Checkpoint of the target base model B.")
@click.option("--source-arch", default=None, help="A's architecture: HF config folder or module:function factory "
              "(default: the checkpoint folder itself).")
@click.option("--target-arch", default=None, help="B's architecture (same forms as --source-arch).")
@click.option("--hf-class", default="AutoModel", show_default=True,
              help="transformers class for HF config folders, e.g. BertForSequenceClassification.")
@click.option("--data", "data", default=None, help="Calibration data: a .safetensors/.pt file of equal-length tensors "
              "(batched as dicts along dim 0) or a module:function returning batches (not needed by naive/identity).")
@click.option("--target-data", default=None, help="Separate calibration data for B (same samples, B's preprocessing).")
@click.option("--loss", "loss_ref", default=None, help="module:function or file.py:function computing loss(model, batch); "
              "'hf' uses model(**batch).loss (not needed by naive/identity).")
@click.option("--method", type=click.Choice(method_names()), default="bico", show_default=True,
              help="Transfer method (listed below with their options).")
@click.option("--method-option", "-o", "method_options", multiple=True, metavar="KEY=VALUE",
              help="An option of the method, e.g. -o center=true -o whiten_p=0.25 (repeatable; see below).")
@click.option("--alpha", type=float, default=1.0, show_default=True, help="Scale of the transported task vector.")
@click.option("--batch-size", type=int, default=32, show_default=True, help="Rows per calibration batch (tensor files).")
@click.option("--max-batches", type=int, default=None, help="Use at most this many calibration batches.")
@click.option("--options-from", "options_from", default=None, type=click.Path(dir_okay=False),
              help="Start from the transfer options recorded in an earlier run's report.json (options given on this "
                   "command line replace recorded ones).")
@click.option("--diagnose", "diagnose_only", is_flag=True, default=False,
              help="Do not transfer: report per layer how well A and B align (CKA of activations and gradients, "
                   "Procrustes similarity, map ranks) and estimate the share of the task vector that will carry "
                   "over; writes diagnosis.json into --out.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output folder.")
@transfer_options
def transfer(source_base, source_finetuned, target_base, source_arch, target_arch, hf_class, data, target_data, loss_ref,
             method, method_options, alpha, batch_size, max_batches, options_from, diagnose_only, out_dir,
             **option_values):
    """Transfer a task vector from base model A to base model B without training (BiCo, arXiv 2605.28444).

    Runs A and B once (forward + backward) over the calibration data, fits per layer an
    orthogonal Procrustes map on input activations and one on output gradients, maps
    tau_A = A_ft - A onto B's parameters, and writes into --out:

    \b
      model.safetensors        B's weights + alpha * tau_B
      task_vector.safetensors  tau_B itself (apply another alpha later)
      report.json              per layer: map shapes, CKA, alignment residuals, norms;
                               time and peak memory

    Nothing is written unless the whole transfer succeeds. With --diagnose, nothing is transferred:
    diagnosis.json holds per layer the alignment of A and B and an estimate of the share of the task
    vector that will carry over (see docs/transfer.md, "Before trusting a transfer").

    \b
    Examples:
      # Hugging Face folders (config.json + model.safetensors), loss from the model's labels
      ftlab transfer --source-base bert-small --source-finetuned bert-small-sst2 \\
          --target-base bert-wide --hf-class BertForSequenceClassification \\
          --data calib.safetensors --loss hf --out out/
      # plain PyTorch: factories and a loss in your own module
      ftlab transfer --source-base a.safetensors --source-finetuned a_ft.safetensors \\
          --target-base b.safetensors --source-arch mymodels:small --target-arch mymodels:wide \\
          --data mymodels:calibration_batches --loss mymodels:loss --method bico -o center=true \\
          --alpha 0.8 --out out/
    """
    import torch

    from ftlab import __version__
    from ftlab.core.validate import check_finite, check_int
    from ftlab.transfer import diagnose, fit_transfer, get_method
    from ftlab.transfer.align import RankWarning
    from ftlab.transfer.io import save_state_dict

    check_finite("alpha", alpha)
    check_int("batch_size", batch_size, 1)
    if max_batches is not None:
        check_int("max_batches", max_batches, 1)
    m = get_method(method, **parse_method_options(method_options))  # validate before loading any model
    opts = build_options(option_values, options_from)
    from ftlab.core.results import output_lock, staged_output

    with output_lock(out_dir):  # a second run on the same --out is refused, not interleaved
        t0 = time.perf_counter()
        A = build_model(source_arch, source_base, hf_class, "source base")
        A_ft = build_model(source_arch, source_finetuned, hf_class, "source finetuned")
        B = build_model(target_arch, target_base, hf_class, "target base")
        if diagnose_only and m.calibration != "maps":
            raise ValueError(f"--diagnose needs a method that fits maps (e.g. bico), not {method}")
        if m.calibration is not None and data is None:
            raise ValueError(f"--method {method} needs calibration data: give --data")
        if m.calibration is not None and m.needs_loss and loss_ref is None:
            raise ValueError(f"--method {method} fits maps on gradients and needs a loss: give --loss "
                             "(activation_only runs forward passes only)")
        loss = None if loss_ref is None else _hf_loss if loss_ref == "hf" else load_callable(loss_ref, "--loss")
        batches = None if data is None else load_batches(data, batch_size, max_batches)
        source_batches = target_batches = None
        if target_data is not None and batches is not None:
            source_batches, target_batches = batches, load_batches(target_data, batch_size, max_batches)
            batches = None
        if diagnose_only:
            from ftlab.core.results import save_json, to_jsonable

            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", RankWarning)
                diag = diagnose(A, A_ft, B, batches, loss, method=m, options=opts, source_batches=source_batches,
                                target_batches=target_batches)
            inputs = {"source_base": source_base, "source_finetuned": source_finetuned, "target_base": target_base,
                      "data": data, "loss": loss_ref}
            report = {"ftlab_version": __version__, "inputs": inputs,
                      **diag.report(), "rank_warnings": [str(w.message) for w in caught
                                                         if issubclass(w.category, RankWarning)],
                      "total_time_s": time.perf_counter() - t0}
            json.dumps(to_jsonable(report))  # fail before writing anything if the report is not serialisable
            out = Path(out_dir)
            with staged_output(out) as stage:
                save_json(stage / "diagnosis.json", report)
            click.echo(diag.summary())
            click.echo(f"ftlab transfer --diagnose: wrote {out}/diagnosis.json")
            return
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RankWarning)
            res = fit_transfer(A, A_ft, B, batches, loss, method=m, options=opts, source_batches=source_batches,
                               target_batches=target_batches)
        rank_notes = [str(w.message) for w in caught if issubclass(w.category, RankWarning)]
        for w in caught:
            if not issubclass(w.category, RankWarning):
                warnings.showwarning(w.message, w.category, w.filename, w.lineno)
        tv = res.task_vector
        model = tv.apply_(B, alpha)  # B was loaded here, so in place is safe
        bad = [k for k, v in model.state_dict().items() if v.is_floating_point() and not torch.isfinite(v).all()]
        if bad:
            raise ValueError(f"the transferred weights are not finite at {bad[0]!r}")
        report = {"ftlab_version": __version__, "inputs": {"source_base": source_base, "source_finetuned": source_finetuned,
                                                            "target_base": target_base, "data": data, "loss": loss_ref},
                  "alpha": alpha, **res.report(), "rank_warnings": rank_notes, "total_time_s": time.perf_counter() - t0}
        from ftlab.core.results import save_json, to_jsonable

        json.dumps(to_jsonable(report))  # fail before writing anything if the report is not serialisable
        out = Path(out_dir)
        with staged_output(out) as stage:  # all files appear together, or none (a previous set is kept)
            save_state_dict(stage / "task_vector.safetensors", tv.state_dict(), metadata={"format": "ftlab-task-vector"})
            save_state_dict(stage / "model.safetensors", model.state_dict(),
                            metadata={"format": "pt", "ftlab_alpha": str(alpha)})
            config = getattr(model, "config", None)
            if config is not None and hasattr(config, "to_json_string"):  # make --out a loadable Hugging Face folder
                from ftlab.core.results import atomic_write_text

                atomic_write_text(stage / "config.json", config.to_json_string())
            save_json(stage / "report.json", report)
        click.echo(f"ftlab transfer: {method}, {res.n_batches} calibration batches, "
                   f"||tau_A|| = {res.source_norms['total']:.4g}, ||tau_B|| = {tv.norm():.4g}, alpha = {alpha:g}; "
                   f"wrote {out}/model.safetensors, task_vector.safetensors, report.json")
        if rank_notes:
            click.echo(f"ftlab transfer: note: {len(rank_notes)} maps were fitted from fewer calibration rows than "
                       "their width or from a rank-deficient cross-covariance (partly arbitrary; see rank_warnings in "
                       "report.json)",
                       err=True)
