"""One seed of the LoRA-transfer study: a practitioner's adapter on base A, carried to base B by ftlab.

Setup, as a user has it (:func:`run_seed`):

* **Folders.** A and B are Hugging Face *base* folders (``BertModel`` / ``MPNetModel``): MiniLM-L3 converted
  from its ONNX package (``ftlab.data.text.load_minilm_l3``, saved with a pooler drawn at seed 0, as a user
  converting it gets), the all-MiniLM-L6-v2 package folder as installed, all-mpnet-base-v2's folder. Each is
  loaded with ``AutoModelForSequenceClassification`` by ftlab's loader (:func:`ftlab.transfer.io.load_model`,
  transformers' prefix rule): the classifier is new, drawn from torch's generator seeded by the study seed.
* **Task.** A WordNet supersense task (:mod:`ftlab.experiments.transfer_accuracy.text`): ``n_train`` training
  glosses (drawn by the seed), fixed validation and test glosses; the calibration rows are the first
  ``n_cal`` training glosses, with their labels.
* **A's adapter.** PEFT LoRA, rank 8 (``lora_alpha`` 16, dropout 0.1) on the attention query and value
  projections, the classifier in ``modules_to_save``, trained ``epochs`` epochs with AdamW at ``lr``, batch
  32 (:func:`ftlab.experiments.training.train_`).

Arms (:data:`ARMS`), each scored on the split ``cfg.split`` and stored as one record:

``a_lora`` A with its adapter; ``probe`` B's linear probe (the head's last layer fitted on base B's rows of
all training glosses, :func:`ftlab.transfer.heads.fit_linear_head`); ``probe_cal`` the same on the ``n_cal``
calibration rows only; ``direct`` a LoRA trained on B with A's recipe; ``copy`` A's adapter loaded onto B as
it is (where the names and shapes fit); ``naive`` the naive transfer (pad/truncate, the head as a delta);
``bico_delta`` BiCo with the head as a delta (ftlab's behaviour before :mod:`ftlab.transfer.heads`);
``ftlab`` ftlab's defaults (BiCo, ``heads="refit"``, ``copies="split"``, alpha 1), written as a PEFT adapter
(:func:`ftlab.transfer.adapters.write_transfer_adapter`) and scored as ``PeftModel.from_pretrained`` loads it;
``heal`` / ``fresh``: ``k`` steps of LoRA training on the calibration rows (:func:`ftlab.transfer.heal.heal_adapter`,
the same recipe) from ftlab's adapter and from a fresh LoRA on B (PEFT's initialisation), for each ``k`` in
``cfg.heal_steps``. Design runs (``cfg.design``) score ``ftlab`` with ``heads`` in ``refit``, ``carry``,
``delta`` and alpha in ``cfg.alphas`` instead.
"""

from __future__ import annotations

import copy
import json
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from ftlab.core.validate import check_choice, check_int

__all__ = ["ARMS", "PAIRS", "StudyConfig", "load_store", "run_seed"]

#: The arms of a judge run, in the order they run.
ARMS = ("a_lora", "probe", "probe_cal", "direct", "copy", "naive", "bico_delta", "ftlab", "heal", "fresh")

#: (source folder key, target folder key, LoRA target modules of A, of B).
PAIRS: dict[str, tuple[str, str, tuple[str, ...], tuple[str, ...]]] = {
    "minilm_l3->minilm_l6": ("minilm_l3", "minilm_l6", ("query", "value"), ("query", "value")),
    "minilm_l6->mpnet_base": ("minilm_l6", "mpnet_base", ("query", "value"), ("q", "v")),
}


@dataclass(frozen=True)
class StudyConfig:
    """One (task, pair, seed) of the study; see the module docstring."""

    task: str
    pair: str
    seed: int
    split: str = "test"
    n_train: int = 1200
    n_val: int = 400
    n_test: int = 600
    n_cal: int = 100
    max_length: int = 24
    epochs: int = 3
    lr: float = 3e-3
    heal_steps: tuple[int, ...] = (0, 10, 25, 50, 100)
    design: bool = False
    alphas: tuple[float, ...] = (0.5, 1.0, 1.5)

    def __post_init__(self) -> None:
        check_choice("pair", self.pair, list(PAIRS))
        check_choice("split", self.split, ("val", "test"))
        for k in ("n_train", "n_val", "n_test", "n_cal", "max_length", "epochs"):
            check_int(k, getattr(self, k), 1)
        if self.n_cal > self.n_train:
            raise ValueError(f"n_cal={self.n_cal} is out of range: at most n_train={self.n_train}")

    def key(self) -> dict:
        return {"task": self.task, "pair": self.pair, "split": self.split, "seed": self.seed}


# --- the store -------------------------------------------------------------------------------------------


def load_store(path: str | Path) -> list[dict]:
    """The records of a study store (JSON lines; a missing file is empty)."""
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]


def _append(path: Path, rec: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(rec) + "\n")
        fh.flush()


# --- folders, models, data -------------------------------------------------------------------------------


def _folder(key: str, root: Path) -> Path:
    """The practitioner's base folder of an encoder (built once under ``root`` where it needs converting)."""
    from ftlab.data.text import load_minilm_l3, minilm_l6_path

    if key == "minilm_l6":
        return minilm_l6_path()
    if key == "mpnet_base":
        from ftlab.data.weights import mpnet_base_path

        return mpnet_base_path()
    out = root / "models" / key
    if not (out / "model.safetensors").is_file():
        from transformers import AutoTokenizer, BertModel

        enc, _ = load_minilm_l3()
        torch.manual_seed(0)
        model = BertModel(enc.config)  # with a pooler, as a user converting the ONNX file builds it
        model.load_state_dict(enc.state_dict(), strict=False)
        model.save_pretrained(str(out))
        AutoTokenizer.from_pretrained(str(minilm_l6_path()), local_files_only=True).save_pretrained(str(out))
    return out


def _load(folder: Path, n_labels: int, seed: int, role: str) -> nn.Module:
    from ftlab.transfer.io import load_model

    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(seed)
        return load_model(None, folder, hf_class="AutoModelForSequenceClassification", role=role,
                          num_labels=n_labels)


def _ids_for(key: str, x: dict) -> dict:
    """Inputs of encoder ``key`` from BERT-tokenized ``x`` (MPNet id = BERT id + 4, special tokens by role)."""
    if key != "mpnet_base":
        return x
    from ftlab.data.text import bert_to_mpnet_ids

    return {**x, "input_ids": bert_to_mpnet_ids(x["input_ids"].clone())}


class _Logits(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: dict) -> torch.Tensor:
        return self.model(**x).logits


def _accuracy(model: nn.Module, x: dict, y: torch.Tensor) -> float:
    from ftlab.experiments.training import accuracy

    return accuracy(_Logits(model), x, y, batch_size=200)


def _hf_loss(model, batch):
    return model(**batch).loss


def _batches(x: dict, y: torch.Tensor, n: int, size: int = 32) -> list[dict]:
    return [{**{k: v[i:min(i + size, n)] for k, v in x.items()}, "labels": y[i:min(i + size, n)]}
            for i in range(0, n, size)]


def _train_lora(base: nn.Module, modules: tuple[str, ...], x: dict, y: torch.Tensor, cfg: StudyConfig, seed: int):
    import peft

    from ftlab.experiments.training import TrainConfig, train_

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        pm = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(
            r=8, lora_alpha=16, lora_dropout=0.1, target_modules=list(modules), modules_to_save=["classifier"]))
    wrapped = _Logits(pm)
    frozen = tuple(n for n, p in wrapped.named_parameters() if not p.requires_grad)
    train_(wrapped, x, y, config=TrainConfig(optimizer="adamw", lr=cfg.lr, batch_size=32, epochs=cfg.epochs,
                                             frozen=frozen), seed=seed)
    return pm.eval()


# --- one seed --------------------------------------------------------------------------------------------


def run_seed(cfg: StudyConfig, store: str | Path, root: str | Path, *, log: Callable[[str], None] = print) -> None:
    """Run every arm of ``cfg`` that ``store`` does not hold yet, appending one record per arm (see the module
    docstring). ``root`` keeps the converted folders and the trained adapters (reused on a rerun)."""
    import peft

    from ftlab.data.text import load_minilm_l6
    from ftlab.experiments.transfer_accuracy.text import load_text_task
    from ftlab.transfer import TransferOptions, fit_transfer
    from ftlab.transfer.adapters import write_transfer_adapter
    from ftlab.transfer.heads import fit_linear_head, layer_inputs
    from ftlab.transfer.heal import HealRecipe, fresh_lora, heal_adapter

    store, root = Path(store), Path(root)
    done = {(r["arm"], r.get("k")) for r in load_store(store) if all(r.get(k) == v for k, v in cfg.key().items())}
    src_key, tgt_key, mods_a, mods_b = PAIRS[cfg.pair]
    cache = root / "cache" / f"{cfg.task}-{cfg.pair.replace('->', '_to_')}-s{cfg.seed}"
    cache.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    _, tok = load_minilm_l6()
    data = load_text_task(cfg.task, tok, n_train=cfg.n_train, n_val=cfg.n_val, n_test=cfg.n_test,
                          max_length=cfg.max_length, seed=cfg.seed)
    k = data.n_classes
    xs, ys = (data.x_val, data.y_val) if cfg.split == "val" else (data.x_test, data.y_test)
    A = _load(_folder(src_key, root), k, cfg.seed, "source base")
    B = _load(_folder(tgt_key, root), k, cfg.seed + 1000, "target base")
    xa_tr, xb_tr = _ids_for(src_key, data.x_train), _ids_for(tgt_key, data.x_train)
    xb_s = _ids_for(tgt_key, xs)
    cal_a, cal_b = _batches(xa_tr, data.y_train, cfg.n_cal), _batches(xb_tr, data.y_train, cfg.n_cal)

    def record(arm: str, acc: float, k_steps: int | None = None, **extra) -> None:
        rec = {**cfg.key(), "arm": arm, "k": k_steps, "acc": acc, **extra, "config": asdict(cfg)}
        _append(store, rec)
        done.add((arm, k_steps))
        log(f"{cfg.task} {cfg.pair} seed {cfg.seed} {arm}{'' if k_steps is None else f' k={k_steps}'}: {acc:.4f}")

    adapter_a = cache / "a_lora"
    if not (adapter_a / "adapter_config.json").is_file():
        t0 = time.perf_counter()
        _train_lora(A, mods_a, xa_tr, data.y_train, cfg, cfg.seed).save_pretrained(str(adapter_a))
        log(f"trained A's adapter in {time.perf_counter() - t0:.0f} s")
    if ("a_lora", None) not in done:
        record("a_lora", _accuracy(peft.PeftModel.from_pretrained(copy.deepcopy(A), str(adapter_a)),
                                   _ids_for(src_key, xs), ys))
    head = "classifier" if tgt_key != "mpnet_base" else "classifier.out_proj"
    for arm, n in (("probe", cfg.n_train), ("probe_cal", cfg.n_cal)):
        if (arm, None) in done or cfg.design and arm == "probe_cal":
            continue
        probe = copy.deepcopy(B)
        if tgt_key == "mpnet_base":  # the head's first layer as ftlab sets it: the identity
            with torch.no_grad():
                probe.classifier.dense.weight.copy_(torch.eye(probe.classifier.dense.weight.shape[0]))
                probe.classifier.dense.bias.zero_()
        rows = torch.cat(layer_inputs(probe, head, _batches(xb_tr, data.y_train, n, 200)))
        W, b, rec = fit_linear_head(rows, data.y_train[:n], k)
        mod = dict(probe.named_modules())[head]
        with torch.no_grad():
            mod.weight.copy_(W)
            mod.bias.copy_(b)
        record(arm, _accuracy(probe, xb_s, ys), **{"lambda": rec["lambda"]})
    if ("direct", None) not in done and not cfg.design:
        t0 = time.perf_counter()
        record("direct", _accuracy(_train_lora(B, mods_b, xb_tr, data.y_train, cfg, cfg.seed + 1), xb_s, ys),
               train_s=time.perf_counter() - t0)
    if ("copy", None) not in done and not cfg.design and src_key == "minilm_l3":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            record("copy", _accuracy(peft.PeftModel.from_pretrained(copy.deepcopy(B), str(adapter_a)), xb_s, ys))

    def transfer(method: str, heads: str):
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = fit_transfer(A, str(adapter_a), B, loss=_hf_loss, method=method, source_batches=cal_a,
                               target_batches=cal_b, options=TransferOptions(heads=heads, **_pair_options(cfg, B)))
        return res, time.perf_counter() - t0

    def score_adapter(res, alpha: float, folder: Path) -> float:
        folder.mkdir(parents=True, exist_ok=True)
        write_transfer_adapter(folder, res, B, alpha=alpha)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _accuracy(peft.PeftModel.from_pretrained(copy.deepcopy(B), str(folder)), xb_s, ys)

    if cfg.design:
        for rule in ("refit", "carry", "delta"):
            todo = [a for a in cfg.alphas if (f"ftlab heads={rule} alpha={a:g}", None) not in done]
            if not todo:
                continue
            res, secs = transfer("bico", rule)
            for a in todo:
                record(f"ftlab heads={rule} alpha={a:g}", score_adapter(res, a, cache / f"design-{rule}-{a:g}"),
                       transfer_s=secs)
        return
    for arm, method, rule in (("naive", "naive", "delta"), ("bico_delta", "bico", "delta"), ("ftlab", "bico", "refit")):
        if (arm, None) in done and (arm != "ftlab" or (cache / "ftlab" / "adapter_config.json").is_file()):
            continue
        res, secs = transfer(method, rule)
        acc = score_adapter(res, 1.0, cache / arm)
        if (arm, None) not in done:
            record(arm, acc, transfer_s=secs, heads=res.heads.report() if res.heads is not None else None)
    recipe = HealRecipe(max(cfg.heal_steps), lr=cfg.lr, clip=0.0, seed=cfg.seed)
    fresh = cache / "fresh"
    if not (fresh / "adapter_config.json").is_file():
        fresh.mkdir(parents=True, exist_ok=True)
        fresh_lora(B, fresh, r=8, target_modules=mods_b, modules_to_save=["classifier"], lora_alpha=16, seed=cfg.seed)
    for arm, start in (("heal", cache / "ftlab"), ("fresh", fresh)):
        if all((arm, s) in done for s in cfg.heal_steps):
            continue

        def at(step: int, model: nn.Module, _arm: str = arm) -> None:
            if step in cfg.heal_steps and (_arm, step) not in done:
                same = [r["acc"] for r in load_store(store) if _arm == "heal" and step == 0 and r["arm"] == "ftlab"
                        and all(r.get(q) == v for q, v in cfg.key().items())]  # step 0 of the heal: ftlab's adapter
                record(_arm, same[0] if same else _accuracy(model, xb_s, ys), step)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            heal_adapter(B, start, cal_b, _hf_loss, recipe, callback=at)


def _pair_options(cfg: StudyConfig, target: nn.Module) -> dict:
    """Options a pair needs that a user gives on the command line by default: MPNet's vocabulary map from the two
    tokenizers (what ``ftlab transfer`` builds itself for text data)."""
    if PAIRS[cfg.pair][1] != "mpnet_base":
        return {}
    from transformers import AutoTokenizer

    from ftlab.data.text import load_minilm_l6
    from ftlab.data.weights import mpnet_base_path
    from ftlab.transfer.automap import vocab_map_from_tokenizers

    _, tok_a = load_minilm_l6()
    tok_b = AutoTokenizer.from_pretrained(str(mpnet_base_path()), local_files_only=True)
    return {"vocab_map": vocab_map_from_tokenizers(tok_a, tok_b, target.get_input_embeddings().num_embeddings)}
