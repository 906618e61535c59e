"""A real PEFT LoRA adapter carried to another base with ``ftlab transfer --out-format lora``, judged on a real task.

    python benchmarks/bench_lora_transfer.py --pilot            # premise pilot: probe vs a LoRA trained on B (seed 100)
    python benchmarks/bench_lora_transfer.py                    # the run: every pair and seed (resumes from its store)
    python benchmarks/bench_lora_transfer.py --report           # tables, verdicts and figure from the store only
    python benchmarks/bench_lora_transfer.py --report --from-csv docs/lora-transfer.csv   # the committed table (+ store)
    python benchmarks/bench_lora_transfer.py --task wordnet      # the design task (validation data), its own store

The task, chosen because it was not used to design any of ftlab's defaults: Debian package synopses (the
``Description:`` line of apt's bookworm ``main`` index, :func:`ftlab.data.text.load_debian_sections`) labelled by
their archive section, six sections (``SECTIONS``), per seed 200 training and 100 test synopses per section drawn
from the pool. The first 100 training texts of a seed are the calibration file every transfer and heal gets.

Per pair (source base A -> target base B) and seed, the rows are:

* ``A+LoRA``: a PEFT LoRA (rank 8, ``lora_alpha`` 16, dropout 0.1, on the query/value projections, the classifier
  in ``modules_to_save``) trained on A for 3 epochs (AdamW 1e-3, batch 16, 64 tokens);
* ``B probe``: B frozen, a multinomial logistic regression (L-BFGS, L2 1e-3) on the classifier's input features;
* ``B+LoRA``: the same LoRA recipe trained on B directly (the reference a transfer should approach);
* ``ftlab``: ``ftlab transfer`` with its defaults, as docs/transfer.md and ``--help`` show the command for the pair;
* ``naive``: the same command with ``--method naive`` (pad/truncate); ``copy``: A's adapter loaded onto B as it is
  (only where the shapes agree);
* ``ftlab, head only``: the same command at ``--alpha 0`` (the head ftlab fits on the 100 calibration texts, on
  B's base features, and no encoder delta): what the transported adapter adds over it;
* ``ftlab + head data`` (and its ``head only`` at alpha 0): the same command with ``--head-data`` naming all 1,200
  labelled training texts of the seed, on which the new head is refitted (the maps still see only the 100
  calibration texts);
* ``heal k``: ftlab's adapter after k steps of LoRA training on the 100 calibration texts (AdamW 1e-3, batch 16,
  ``ftlab.transfer.heal``), against a fresh LoRA on B trained the same k steps on the same texts;
  ``heal ftlab + head data k``: the ``ftlab + head data`` adapter healed the same way (part ``heal head data``, added
  after the held-out run: an ftlab finding, judged by no goal);
* ``heal on train, ... k`` (part ``heal train``, a second recipe added after the first missed, its goal fixed in
  ``GOALS`` before its runs): the ``ftlab + head data`` adapter and a fresh LoRA healed k steps on all 1,200
  labelled training texts (the ``--head-data`` file), same optimiser, rate and batch; part ``heal train nodrop``:
  the same with B's dropout off while it trains, part ``heal train low lr``: the same at lr 1e-4 (findings, no
  goal).

Store: ``<out>/lora-transfer.jsonl`` (one line per pair, seed and part; a killed run resumes), trained adapters
under ``<out>/lora-work``. The report writes docs/lora-transfer.csv, the generated block of docs/lora-transfer.md and
docs/figures/lora-heal.png.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# Fixed before the run from the pilot (see docs/lora-transfer.md): six sections of comparable size whose
# synopses are not separable by one keyword.
SECTIONS = ("admin", "net", "science", "sound", "text", "utils")
PILOT_SECTIONS = {
    "six": SECTIONS,
    "easy": ("admin", "games", "graphics", "net", "science", "sound"),
}
#: The design task's classes (``--task wordnet``): the six most frequent WordNet verb supersenses.
DESIGN_CLASSES = ("verb.change", "verb.contact", "verb.communication", "verb.motion", "verb.social", "verb.possession")
N_TRAIN, N_TEST, N_CALIB = 200, 100, 100  # per section, per section, in all
SEEDS = (0, 1, 2, 3, 4)
HEAL_STEPS = (0, 10, 25, 50, 100)
MAX_LEN, BATCH, EPOCHS, LR, RANK = 64, 16, 3, 1e-3, 8
PAIRS = {
    # name: (A, B, LoRA modules of A, of B, extra arguments of the documented command)
    "MiniLM-L3 -> L6": ("minilm-l3", "minilm-l6", ("query", "value"), ("query", "value"), ()),
    "MiniLM-L6 -> MPNet": ("minilm-l6", "mpnet", ("query", "value"), ("q", "v"), ("--seq-align", "mean")),
}
HF_CLASS = "AutoModelForSequenceClassification"
PARTS = ("source", "probe", "direct", "transfer", "heal", "head only", "head data", "heal head data", "heal train",
         "heal train nodrop", "heal train low lr")


# ------------------------------------------------------------------------------------------------ data and models
def task(seed: int, sections: tuple[str, ...] = SECTIONS, which: str = "debian") -> dict[str, list]:
    """Texts and labels of one seed: ``train`` (200 per class, shuffled; its first 100 are ``calib``), ``test``.

    ``which``: ``debian`` (the held-out task, ``sections`` its classes) or ``wordnet`` (the design task: WordNet verb
    glosses labelled by their supersense, the ``DESIGN_CLASSES``; its ``test`` split is validation data)."""
    if which == "wordnet":
        from ftlab.data.text import load_wordnet_supersenses

        wn = load_wordnet_supersenses(pos="verb")
        keep = [wn.classes.index(c) for c in DESIGN_CLASSES]
        labels = np.asarray(wn.labels)
        texts = [wn.glosses[i] for i in range(len(labels)) if labels[i] in keep]
        ys = np.array([keep.index(y) for y in labels if y in keep])
        classes = list(DESIGN_CLASSES)
    else:
        from ftlab.data.text import load_debian_sections

        data = load_debian_sections(sections=sections)
        texts, ys, classes = list(data.synopses), np.asarray(data.labels), list(data.classes)
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c in range(len(classes)):
        idx = rng.permutation(np.flatnonzero(ys == c))
        if idx.size < N_TRAIN + N_TEST:
            raise ValueError(f"class {classes[c]!r} has {idx.size} texts, fewer than {N_TRAIN + N_TEST}")
        train += [(texts[i], c) for i in idx[:N_TRAIN]]
        test += [(texts[i], c) for i in idx[N_TRAIN:N_TRAIN + N_TEST]]
    order = rng.permutation(len(train))
    train = [train[i] for i in order]
    return {"train": train, "test": test, "calib": train[:N_CALIB], "classes": classes}


def base_folder(name: str, work: Path) -> Path:
    """The Hugging Face folder of a base as a user has it (L3 is converted once from its ONNX file)."""
    from ftlab.data.text import minilm_l6_path
    from ftlab.data.weights import mpnet_base_path

    if name == "minilm-l6":
        return minilm_l6_path()
    if name == "mpnet":
        return mpnet_base_path()
    folder = work / "bases" / name
    if not (folder / "model.safetensors").is_file():
        import torch
        from transformers import BertModel

        from ftlab.data.text import load_minilm_l3

        encoder, tok = load_minilm_l3()
        torch.manual_seed(0)  # the ONNX export holds no pooler: the folder gets one drawn here, as a checkpoint has one
        model = BertModel(encoder.config)
        missing, unexpected = model.load_state_dict(encoder.state_dict(), strict=False)
        if unexpected or any(not k.startswith("pooler.") for k in missing):
            raise RuntimeError(f"MiniLM-L3 does not fit BertModel: missing {missing}, unexpected {unexpected}")
        tmp = folder.with_name(name + ".tmp")
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        tmp.rename(folder)
    return folder


def load_task_model(folder: Path, n_labels: int, seed: int):
    import torch
    from transformers import AutoModelForSequenceClassification, logging

    logging.set_verbosity_error()
    torch.manual_seed(seed)
    return AutoModelForSequenceClassification.from_pretrained(str(folder), num_labels=n_labels)


def batches(tok, rows, size: int, *, labels: bool = True) -> list[dict]:
    import torch

    out = []
    for i in range(0, len(rows), size):
        chunk = rows[i:i + size]
        enc = dict(tok([t for t, _ in chunk], truncation=True, max_length=MAX_LEN, padding=True, return_tensors="pt"))
        if labels:
            enc["labels"] = torch.tensor([y for _, y in chunk])
        out.append(enc)
    return out


def test_accuracy(model, tok, rows) -> float:
    """Share of ``rows`` (text, label) the model classifies right."""
    import torch

    model.eval()
    pred = []
    with torch.no_grad():
        for b in batches(tok, rows, 64, labels=False):
            pred.append(model(**b).logits.argmax(-1))
    return float((torch.cat(pred) == torch.tensor([y for _, y in rows])).double().mean())


def tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def train_lora(folder: Path, modules, rows, n_labels: int, seed: int, out: Path) -> None:
    """The LoRA recipe of the benchmark, trained on ``rows`` and saved into ``out`` (skipped when present)."""
    import peft
    import torch

    if (out / "adapter_model.safetensors").is_file():
        return
    model = load_task_model(folder, n_labels, seed)
    pm = peft.get_peft_model(model, peft.LoraConfig(r=RANK, lora_alpha=2 * RANK, lora_dropout=0.1,
                                                    target_modules=list(modules), modules_to_save=["classifier"]))
    tok = tokenizer(folder)
    opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=LR)
    g = np.random.default_rng(seed)
    pm.train()
    for _ in range(EPOCHS):
        order = g.permutation(len(rows))
        for b in batches(tok, [rows[i] for i in order], BATCH):
            loss = pm(**b).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    tmp = out.with_name(out.name + ".tmp")
    pm.save_pretrained(str(tmp))
    tmp.rename(out)


def with_adapter(folder: Path, adapter: Path, n_labels: int, seed: int):
    import peft

    return peft.PeftModel.from_pretrained(load_task_model(folder, n_labels, seed), str(adapter)).eval()


def probe_accuracy(folder: Path, data: dict, seed: int) -> float:
    """B frozen; logistic regression (L-BFGS, L2 1e-3 on the weights) on the classifier's input features."""
    import torch

    model = load_task_model(folder, len(data["classes"]), seed).eval()
    tok = tokenizer(folder)
    feats: list = []
    def keep(module, args) -> None:  # MPNet's head reads token 0 of the sequence, BERT's the pooled row
        x = args[0].detach()
        feats.append(x[:, 0] if x.dim() == 3 else x)

    hook = model.classifier.register_forward_pre_hook(keep)

    def features(rows):
        feats.clear()
        with torch.no_grad():
            for b in batches(tok, rows, 64, labels=False):
                model(**b)
        return torch.cat(feats).double()

    xtr, xte = features(data["train"]), features(data["test"])
    hook.remove()
    mu, sd = xtr.mean(0), xtr.std(0) + 1e-6
    xtr, xte = (xtr - mu) / sd, (xte - mu) / sd
    ytr = torch.tensor([y for _, y in data["train"]])
    w = torch.zeros(xtr.shape[1], len(data["classes"]), dtype=torch.float64, requires_grad=True)
    b = torch.zeros(len(data["classes"]), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=500, tolerance_grad=1e-9, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(xtr @ w + b, ytr) + 1e-3 * (w * w).sum()
        loss.backward()
        return loss

    opt.step(closure)
    pred = (xte @ w + b).argmax(-1)
    return float((pred == torch.tensor([y for _, y in data["test"]])).double().mean())


def run_transfer(a: Path, adapter: Path, b: Path, calib: Path, out: Path, extra) -> dict:
    """``ftlab transfer`` as a user runs it, in its own process; returns wall time and the report's figures."""
    if not (out / "report.json").is_file():
        ftlab = Path(sys.executable).with_name("ftlab")
        cmd = [str(ftlab), "transfer", "--source-base", str(a), "--source-finetuned", str(adapter), "--target-base",
               str(b), "--hf-class", HF_CLASS, "--data", str(calib), "--out", str(out), *extra]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"ftlab transfer failed ({done.returncode}): {done.stderr.strip()[-800:]}")
        (out / "stderr.txt").write_text(done.stderr)
        (out / "wall_s.txt").write_text(f"{time.perf_counter() - t0:.2f}")
    report = json.loads((out / "report.json").read_text())
    diag = report.get("diagnostic") or {}
    return {"wall_s": float((out / "wall_s.txt").read_text()), "estimate": diag.get("estimate"),
            "peak_mb": report.get("peak_rss_mb")}


# ------------------------------------------------------------------------------------------------ one point
@dataclass
class Point:
    """What every part of one (pair, seed) reads: the bases' folders, the task, the work folder and the command."""

    a_name: str
    b_name: str
    a: Path
    b: Path
    b_mod: tuple
    extra: tuple
    data: dict
    seed: int
    sdir: Path

    @property
    def k(self) -> int:
        return len(self.data["classes"])

    @property
    def a_lora(self) -> Path:
        return self.sdir / f"{self.a_name}-lora"

    @property
    def ftlab_out(self) -> Path:
        return self.sdir / f"{self.a_name}-to-{self.b_name}"

    @property
    def head_data_out(self) -> Path:
        """Where the documented command (``--head-data``) writes its adapter."""
        return self.sdir / f"{self.a_name}-to-{self.b_name}-head-data"

    def head_data_adapter(self) -> Path:
        """The documented command's adapter (``--head-data``), written once (``run_transfer`` keeps a finished one)."""
        run_transfer(self.a, self.a_lora, self.b, self.calib(), self.head_data_out,
                     (*self.extra, "--head-data", str(self.train())))
        return self.head_data_out

    def calib(self) -> Path:
        """The calibration file (the first 100 training texts), written once."""
        calib = self.sdir / "calib.jsonl"
        if not calib.is_file():
            calib.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in self.data["calib"]))
        return calib

    def train(self) -> Path:
        """All labelled training texts (the ``--head-data`` file), written once."""
        path = self.sdir / "train.jsonl"
        if not path.is_file():
            path.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in self.data["train"]))
        return path

    def on_b(self, adapter: Path) -> float:
        """Test accuracy of B with ``adapter`` (the head draw another than the adapter's own)."""
        return test_accuracy(with_adapter(self.b, adapter, self.k, self.seed + 1000), tokenizer(self.b),
                             self.data["test"])

    def transferred(self, row: str, dest: Path, *more: str) -> dict:
        """``ftlab transfer`` with the pair's documented arguments and ``more``, scored on B."""
        info = run_transfer(self.a, self.a_lora, self.b, self.calib(), dest, (*self.extra, *more))
        return {"row": row, "acc": self.on_b(dest), **info}


def _part_transfer(p: Point) -> list[dict]:
    recs = [p.transferred("ftlab", p.ftlab_out), p.transferred("naive", p.sdir / f"{p.a_name}-to-{p.b_name}-naive",
                                                               "--method", "naive")]
    if p.a_name.startswith("minilm") and p.b_name.startswith("minilm"):  # equal widths: A's adapter loads onto B
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            recs.append({"row": "copy", "acc": p.on_b(p.a_lora)})
    return recs


def _part_head_only(p: Point) -> list[dict]:
    """The ablation: ftlab's refitted head on B's base features, no encoder delta."""
    return [p.transferred("ftlab, head only", p.sdir / f"{p.a_name}-to-{p.b_name}-alpha0", "--alpha", "0")]


def _part_head_data(p: Point) -> list[dict]:
    """The head refitted on all 1,200 labelled training texts (``--head-data``), at alpha 1 and 0."""
    train = p.train()
    base = p.head_data_out
    return [p.transferred("ftlab + head data", base, "--head-data", str(train)),
            p.transferred("ftlab + head data, head only", base.with_name(base.name + "-alpha0"), "--head-data",
                          str(train), "--alpha", "0")]


def _heal(p: Point, starts: dict[str, Path], rows: str = "calib", dropout: bool = True, lr: float = LR) -> list[dict]:
    """Each adapter of ``starts`` (row name -> folder) healed k steps on the texts ``p.data[rows]`` (the calibration
    texts, or ``"train"``: all labelled training texts), with B's dropout on or off, scored at HEAL_STEPS."""
    from ftlab.transfer.heal import HealRecipe, heal_adapter

    recs: list[dict] = []
    tok_b = tokenizer(p.b)
    train = batches(tok_b, p.data[rows], BATCH)
    for row, start in starts.items():
        def record(step, model, row=row):
            if step in HEAL_STEPS:
                recs.append({"row": row, "steps": step, "acc": test_accuracy(model, tok_b, p.data["test"])})

        heal_adapter(load_task_model(p.b, p.k, p.seed + 1000), start, train, lambda m, bt: m(**bt).loss,
                     HealRecipe(steps=max(HEAL_STEPS), lr=lr, seed=p.seed, dropout=dropout), callback=record)
    return recs


def _fresh(p: Point) -> Path:
    """A fresh LoRA on B (the recipe's initialisation; seeded), written once: the start every heal is compared with."""
    from ftlab.transfer.heal import fresh_lora

    fresh = p.sdir / f"{p.b_name}-fresh"
    if not (fresh / "adapter_model.safetensors").is_file():
        fresh.mkdir(exist_ok=True)
        fresh_lora(load_task_model(p.b, p.k, p.seed), fresh, r=RANK, target_modules=p.b_mod,
                   modules_to_save=["classifier"], lora_alpha=2 * RANK, seed=p.seed)
    return fresh


def _part_heal(p: Point) -> list[dict]:
    """ftlab's adapter healed k steps on the calibration texts, against a fresh LoRA on B trained the same."""
    run_transfer(p.a, p.a_lora, p.b, p.calib(), p.ftlab_out, p.extra)
    return _heal(p, {"heal ftlab": p.ftlab_out, "heal fresh": _fresh(p)})


def _part_heal_head_data(p: Point) -> list[dict]:
    """The documented command's adapter (``--head-data``) healed the same way (added after the held-out run: an
    ftlab finding, no goal)."""
    p.head_data_adapter()
    return _heal(p, {"heal ftlab + head data": p.head_data_out})


def _part_heal_train(p: Point) -> list[dict]:
    """The documented command's adapter (``--head-data``) healed k steps on the texts it was given as head data (all
    labelled training texts), against a fresh LoRA on B trained the same k steps on them (a second heal recipe, added
    after the held-out run of the others; designed on the WordNet task before its Debian run)."""
    p.head_data_adapter()
    return _heal(p, {"heal on train, ftlab + head data": p.head_data_out, "heal on train, fresh": _fresh(p)},
                 rows="train")


def _part_heal_train_nodrop(p: Point) -> list[dict]:
    """The ``heal train`` recipe with B's dropout off while it trains (``HealRecipe(dropout=False)``; ftlab's finding,
    no goal: tried after a tiny model's heal raised its own training loss with dropout on and not with it off)."""
    p.head_data_adapter()
    return _heal(p, {"heal on train without dropout, ftlab + head data": p.head_data_out}, rows="train",
                 dropout=False)


def _part_heal_train_low_lr(p: Point) -> list[dict]:
    """The ``heal train`` recipe at a tenth of the rate (1e-4; ftlab's finding, no goal: tried on the held-out task
    after the heal at 1e-3 lowered the MPNet adapter in its first steps)."""
    p.head_data_adapter()
    return _heal(p, {"heal on train at lr 1e-4, ftlab + head data": p.head_data_out}, rows="train", lr=LR / 10)


TRANSFER_PARTS = {"transfer": _part_transfer, "head only": _part_head_only, "head data": _part_head_data,
                  "heal": _part_heal, "heal head data": _part_heal_head_data, "heal train": _part_heal_train,
                  "heal train nodrop": _part_heal_train_nodrop, "heal train low lr": _part_heal_train_low_lr}


def run_point(pair: str, seed: int, part: str, sections: tuple[str, ...] = SECTIONS, out: str = "",
              task_name: str = "debian") -> list[dict]:
    """One part of one (pair, seed) of task ``task_name``: records ``{"row", "acc", ...}``."""
    import torch

    if part not in PARTS:
        raise ValueError(f"part {part!r} is not one of {PARTS}")
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    work = Path(out) / "lora-work"
    a_name, b_name, a_mod, b_mod, extra = PAIRS[pair]
    a, b = base_folder(a_name, work), base_folder(b_name, work)
    data = task(seed, tuple(sections), task_name)
    k = len(data["classes"])
    tag = "wordnet" if task_name == "wordnet" else "-".join(sections) if tuple(sections) != SECTIONS else "main"
    sdir = work / tag / f"seed{seed}"
    sdir.mkdir(parents=True, exist_ok=True)
    p = Point(a_name, b_name, a, b, b_mod, extra, data, seed, sdir)
    if part == "source":
        train_lora(a, a_mod, data["train"], k, seed, p.a_lora)
        return [{"row": "A+LoRA", "acc": test_accuracy(with_adapter(a, p.a_lora, k, seed), tokenizer(a), data["test"])}]
    if part == "probe":
        return [{"row": "B probe", "acc": probe_accuracy(b, data, seed)}]
    if part == "direct":
        b_lora = sdir / f"{b_name}-lora"
        train_lora(b, b_mod, data["train"], k, seed, b_lora)
        return [{"row": "B+LoRA", "acc": test_accuracy(with_adapter(b, b_lora, k, seed), tokenizer(b), data["test"])}]
    train_lora(a, a_mod, data["train"], k, seed, p.a_lora)
    return TRANSFER_PARTS[part](p)


# ------------------------------------------------------------------------------------------------ report
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("FTLAB_BENCH_OUT", "results"), help="store and work folder")
    ap.add_argument("--pilot", action="store_true", help="the premise pilot (seed 100, MiniLM-L6 probe vs LoRA)")
    ap.add_argument("--report", action="store_true", help="no training: write the docs from the store")
    ap.add_argument("--from-csv", metavar="CSV",
                    help="report from an earlier run's per-seed table (docs/lora-transfer.csv), its cells filled or "
                         "replaced by the store's records (a run of only the missing parts adds to it)")
    ap.add_argument("--pairs", default=",".join(PAIRS), help="comma-separated pair names")
    ap.add_argument("--seeds", type=int, default=len(SEEDS), help="seeds to run (first n of SEEDS)")
    ap.add_argument("--seed-list", default=None, metavar="S,S",
                    help="these seeds of SEEDS instead of the first --seeds (e.g. one a stopped run left incomplete)")
    ap.add_argument("--parts", default=",".join(PARTS), help="comma-separated parts to run (default: all)")
    ap.add_argument("--task", choices=("debian", "wordnet"), default="debian",
                    help="debian: the held-out task the docs report; wordnet: the design task (its store "
                         "lora-design.jsonl; --report prints its validation table into docs/lora-transfer.md's design "
                         "block)")
    args = ap.parse_args(argv)
    from ftlab.core.sweep import run_sweep

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.pilot:
        points = [{"pair": "MiniLM-L3 -> L6", "seed": 100, "part": part, "sections": list(secs), "out": str(out)}
                  for secs in PILOT_SECTIONS.values() for part in ("probe", "direct")]
        df = run_sweep(run_point, points, store=out / "lora-pilot.jsonl", workers=1, desc="pilot")
        df["sections"] = df["sections"].map(lambda s: ",".join(s))
        print(df.pivot_table(index="sections", columns="row", values="acc").round(3).to_string())
        return
    pairs = [p.strip() for p in args.pairs.split(",")]
    store = out / ("lora-design.jsonl" if args.task == "wordnet" else "lora-transfer.jsonl")
    try:
        seeds = SEEDS[:args.seeds] if args.seed_list is None else [int(x) for x in args.seed_list.split(",")]
    except ValueError:
        seeds = [-1]
    if not set(seeds) <= set(SEEDS):
        raise SystemExit(f"--seed-list {args.seed_list!r}: the seeds are {SEEDS}")
    if args.from_csv and not Path(args.from_csv).is_file():
        raise SystemExit(f"--from-csv {args.from_csv!r}: no such file")
    if not args.report:
        points = [{"pair": pair, "seed": s, "part": part, "out": str(out),
                   **({"task_name": args.task} if args.task != "debian" else {})}
                  for pair in pairs for s in seeds for part in PARTS if part in args.parts.split(",")]
        run_sweep(run_point, points, store=store, workers=1, desc=f"lora transfer ({args.task})")
    if args.task == "wordnet":
        write_design(store)
    else:
        write_report(store, Path(args.from_csv) if args.from_csv else None)


# The goals, fixed before the run (ftlab's own, not a paper's claims): each is a paired difference per seed whose
# 95% Student-t interval decides "met" (interval above 0), "missed" (below 0) or "undecided" (straddles 0).
# The first two goals are judged twice: on the documented command, which since the design run on WordNet
# (docs/lora-transfer.md, "Design") passes the task's labelled training texts as --head-data ("ftlab + head data"),
# and on the command with the 100 calibration texts alone ("ftlab"). Fixed before the held-out run of those rows.
GOALS = {
    "ftlab + head data >= B probe": "ftlab + head data - probe",
    "ftlab + head data closes >= 30% of probe -> B+LoRA": "(ftlab + head data - probe) - 0.3 (B+LoRA - probe)",
    "ftlab >= B probe": "ftlab - probe",
    "ftlab closes >= 30% of probe -> B+LoRA": "(ftlab - probe) - 0.3 (B+LoRA - probe)",
    "heal 50 steps within 2 points of B+LoRA": "heal ftlab@50 - B+LoRA + 0.02",
    # The second heal recipe (part "heal train"), fixed here after the first missed and before its own runs (the
    # WordNet check, then the Debian run): the documented adapter healed 50 steps on its --head-data texts, with the
    # first recipe's optimiser, rate and batch (nothing tuned).
    "heal on train 50 steps within 2 points of B+LoRA": "heal on train, ftlab + head data@50 - B+LoRA + 0.02",
}
PREMISE = "B+LoRA - probe"  # a transfer is judged only where a LoRA on B beats B's probe


def seed_table(records):
    """One row per (pair, seed), one column per row name (heal rows as ``heal ftlab@k``)."""
    import pandas as pd

    df = pd.DataFrame(records)
    if "steps" in df:
        heal = df["steps"].notna()
        df.loc[heal, "row"] = df.loc[heal, "row"] + "@" + df.loc[heal, "steps"].astype(int).astype(str)
    return df.pivot_table(index=["pair", "seed"], columns="row", values="acc")


def goal_values(t) -> dict[str, object]:
    """Per-seed paired differences of the goals and the premise (pandas Series indexed like ``t``)."""
    gap = t["B+LoRA"] - t["B probe"]
    vals = {PREMISE: gap}
    for row in ("ftlab + head data", "ftlab"):
        if row in t:
            vals[f"{row} >= B probe"] = t[row] - t["B probe"]
            vals[f"{row} closes >= 30% of probe -> B+LoRA"] = (t[row] - t["B probe"]) - 0.3 * gap
    if "heal ftlab@50" in t:
        vals["heal 50 steps within 2 points of B+LoRA"] = t["heal ftlab@50"] - t["B+LoRA"] + 0.02
    if "heal on train, ftlab + head data@50" in t:
        vals["heal on train 50 steps within 2 points of B+LoRA"] = \
            t["heal on train, ftlab + head data@50"] - t["B+LoRA"] + 0.02
    return vals


#: Rows every reported seed must have: a seed without one of them (a run stopped midway) would enter some means
#: and not the paired differences, so it is left out of the tables and named below them.
GOAL_ROWS = ("B probe", "B+LoRA", "ftlab + head data", "ftlab")


def complete_seeds(t):
    """``t`` restricted to the (pair, seed) rows holding every row of ``GOAL_ROWS``, and a note naming the others."""
    have = [r for r in GOAL_ROWS if r in t]
    ok = t[have].notna().all(axis=1)
    dropped = ", ".join(f"{p} seed {s}" for p, s in t.index[~ok])
    return t[ok], dropped


def word(lo: float, hi: float) -> str:
    import math

    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "undecided"
    return "met" if lo > 0 else "missed" if hi < 0 else "undecided"


def summary(t) -> str:
    """The short table of docs/transfer.md: per pair, each row's mean and its paired difference to B's probe."""
    from ftlab.experiments.verdicts import t_interval

    rows = ["A+LoRA", "B probe", "B+LoRA", "ftlab + head data", "ftlab + head data, head only", "ftlab",
            "ftlab, head only", "naive", "copy", "heal ftlab@50", "heal ftlab + head data@50", "heal fresh@50",
            "heal on train, ftlab + head data@50", "heal on train, fresh@50"]
    pairs = list(t.index.unique("pair"))
    head = "| | " + " | ".join(f"{p} ({len(t.loc[p])} seeds)" for p in pairs) + " |"
    lines = [head, "|---|" + "---|" * len(pairs)]
    for row in rows:
        cells = []
        for p in pairs:
            tp = t.loc[p]
            if row not in tp or tp[row].isna().all():
                cells.append("n/a")
                continue
            m = tp[row].mean()
            if row == "B probe":
                cells.append(f"{m:.3f}")
                continue
            d, lo, hi = t_interval((tp[row] - tp["B probe"]).to_numpy())
            n = int(tp[row].notna().sum())
            cells.append(f"{m:.3f} ({d:+.3f} [{lo:+.3f}, {hi:+.3f}])" + (f", {n} seeds" if n < len(tp) else ""))
        label = {"heal ftlab@50": "ftlab + 50 heal steps", "heal fresh@50": "fresh LoRA, 50 steps",
                 "heal ftlab + head data@50": "ftlab + head data + 50 heal steps",
                 "heal on train, ftlab + head data@50": "ftlab + head data + 50 steps on the training texts",
                 "heal on train, fresh@50": "fresh LoRA, 50 steps on the training texts"}.get(row, row)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def load_table(store: Path, csv: Path | None = None):
    """The per-seed table and a line naming its source. From the store (and written to docs/lora-transfer.csv); with
    ``csv``, that table (of earlier runs, rounded to 4 decimals, standing in for stores that are gone) with the
    store's records, where there are any, filling or replacing its cells; the merged table is written back."""
    import pandas as pd

    from ftlab.core.results import atomic_write_text
    from ftlab.core.sweep import read_store

    records = [{**e["point"], **r} for e in read_store(store).values() for r in e["records"]] if store.is_file() else []
    if csv is None and not records:
        raise SystemExit(f"{store} holds no finished points: run the benchmark first")
    t = seed_table(records) if records else None
    source = f"{store.name}: {len(records)} records"
    if csv is not None:
        old = pd.read_csv(csv, index_col=["pair", "seed"])
        t = old if t is None else t.combine_first(old)[sorted(set(old.columns) | set(t.columns))]
        source = f"{csv.name} (the per-seed table of earlier runs)" + (f" and {source} (they replace its cells)"
                                                                     if records else "")
    atomic_write_text(DOCS / "lora-transfer.csv", t.round(4).to_csv())
    return t, source


#: The heal figures: file -> (x label, ((row, style, legend), ...)).
HEAL_FIGURES = {
    "lora-heal.png": ("LoRA steps on the 100 calibration texts", (
        ("heal ftlab", "o-", "from ftlab's adapter (calibration texts only)"),
        ("heal fresh", "s--", "fresh LoRA on B"),
        ("heal ftlab + head data", "^-", "from ftlab's adapter with --head-data"))),
    "lora-heal-train.png": ("LoRA steps on the 1,200 training texts (the --head-data file)", (
        ("heal on train, ftlab + head data", "^-", "from ftlab's adapter with --head-data"),
        ("heal on train without dropout, ftlab + head data", "v:", "the same, B's dropout off"),
        ("heal on train at lr 1e-4, ftlab + head data", "D-.", "the same at lr 1e-4"),
        ("heal on train, fresh", "s--", "fresh LoRA on B"))),
}


def _heal_panel(ax, tp, heal: list[str], curves, title: str, xlabel: str) -> None:
    """One pair's heal curves (mean and 95% interval per k) with B's probe and B+LoRA as lines."""
    from ftlab.experiments.verdicts import t_interval

    for row, style, label in curves:
        cols = [c for c in heal if c.startswith(row + "@")]
        if not cols:
            continue
        ks = [int(c.split("@")[1]) for c in cols]
        stats = [t_interval(tp[c].to_numpy()) for c in cols]
        ax.errorbar(ks, [s[0] for s in stats], yerr=[[s[0] - s[1] for s in stats], [s[2] - s[0] for s in stats]],
                    fmt=style, capsize=3, label=label)
    for row, color in (("B probe", "0.5"), ("B+LoRA", "k")):
        if row in tp:
            ax.axhline(tp[row].mean(), color=color, ls=":", label=f"{row} (mean)")
    ax.set(title=title, xlabel=xlabel, ylabel="test accuracy")
    ax.legend(fontsize=7)


def write_report(store: Path, csv: Path | None = None) -> None:
    """docs/lora-transfer.csv (per seed), the generated block of docs/lora-transfer.md, docs/figures/lora-heal.png."""
    from _common import replace_block
    from ftlab.core.plotting import new_figure, save_figure
    from ftlab.experiments.verdicts import t_interval

    t, source = load_table(store, csv)
    t, incomplete = complete_seeds(t)
    order = ["A+LoRA", "B probe", "B+LoRA", "ftlab + head data", "ftlab + head data, head only", "ftlab",
             "ftlab, head only", "naive", "copy"]
    lines = []
    n_pairs = len(t.index.unique("pair"))
    figs = {name: new_figure(1, n_pairs, size=(5.2 * n_pairs, 3.6)) for name, (_, curves) in HEAL_FIGURES.items()
            if any(c.startswith(row + "@") for row, _, _ in curves for c in t.columns)}
    for i, (pair, tp) in enumerate(t.groupby(level="pair", sort=False)):
        tp = tp.droplevel("pair")
        n = len(tp)
        lines += [f"### {pair} ({n} seeds: {', '.join(str(s) for s in tp.index)})", "",
                  "| row | test accuracy, mean [95% interval] | per seed |", "|---|---|---|"]
        heal = sorted((c for c in tp.columns if "@" in c), key=lambda c: (c.split("@")[0], int(c.split("@")[1])))
        for row in order + heal:
            if row not in tp or tp[row].isna().all():
                continue
            m, lo, hi = t_interval(tp[row].to_numpy())
            per_seed = " ".join("n/a" if v != v else f"{v:.3f}" for v in tp[row])  # n/a: a part not run for that seed
            lines.append(f"| {row} | {m:.3f} [{lo:.3f}, {hi:.3f}] | {per_seed} |")
        lines += ["", "| paired difference per seed | mean [95% interval] | goal |", "|---|---|---|"]
        for name, vals in goal_values(tp).items():
            if vals.isna().all():
                lines.append(f"| {name}: {GOALS[name]} | not run | undecided |")
                continue
            m, lo, hi = t_interval(vals.to_numpy())
            label = "premise: " + name if name == PREMISE else f"{name}: {GOALS[name]}"
            verdict = ("holds" if lo > 0 else "fails" if hi < 0 else "undecided") if name == PREMISE else word(lo, hi)
            lines.append(f"| {label} | {m:+.3f} [{lo:+.3f}, {hi:+.3f}] | {verdict} |")
        for name, cols in (("ftlab - ftlab, head only (what the carried encoder delta adds)", ("ftlab", "ftlab, head only")),
                           ("ftlab + head data - its head only (the encoder delta over a cross-validated probe)",
                            ("ftlab + head data", "ftlab + head data, head only")),
                           ("ftlab + head data - ftlab (what the training texts add to the head)",
                            ("ftlab + head data", "ftlab")),
                           ("heal ftlab@50 - heal fresh@50", ("heal ftlab@50", "heal fresh@50")),
                           ("heal ftlab + head data@50 - B+LoRA (the documented adapter after 50 heal steps)",
                            ("heal ftlab + head data@50", "B+LoRA")),
                           ("heal ftlab + head data@50 - ftlab + head data (what the 50 steps add to it)",
                            ("heal ftlab + head data@50", "ftlab + head data")),
                           ("heal on train, ftlab + head data@50 - heal on train, fresh@50 (50 steps on the training "
                            "texts, from the adapter vs from a fresh LoRA)",
                            ("heal on train, ftlab + head data@50", "heal on train, fresh@50")),
                           ("heal on train, ftlab + head data@50 - ftlab + head data (what the 50 steps add to it)",
                            ("heal on train, ftlab + head data@50", "ftlab + head data")),
                           ("heal on train at lr 1e-4@50 - ftlab + head data (what 50 steps at a tenth of the rate "
                            "add)", ("heal on train at lr 1e-4, ftlab + head data@50", "ftlab + head data")),
                           ("heal on train without dropout@50 - with dropout@50 (B's dropout off while it trains)",
                            ("heal on train without dropout, ftlab + head data@50",
                             "heal on train, ftlab + head data@50"))):
            if set(cols) <= set(tp) and not (tp[cols[0]] - tp[cols[1]]).isna().all():
                m, lo, hi = t_interval((tp[cols[0]] - tp[cols[1]]).to_numpy())
                lines.append(f"| {name} | {m:+.3f} [{lo:+.3f}, {hi:+.3f}] | (ftlab's finding, no goal) |")
        for row in ("ftlab + head data", "ftlab"):
            if {row, "B probe", "B+LoRA"} <= set(tp):
                gap = (tp["B+LoRA"] - tp["B probe"]).mean()
                closed = (tp[row] - tp["B probe"]).mean() / gap if gap else float("nan")
                lines.append(f"\nShare of the probe -> B+LoRA gap closed by {row} (ratio of means): {closed:.2f}.")
        for name, (_fig, axes) in figs.items():
            xlabel, curves = HEAL_FIGURES[name]
            _heal_panel(np.atleast_1d(axes)[i], tp, heal, curves, pair, xlabel)
        lines.append("")
    for name, (fig, _) in figs.items():
        save_figure(fig, DOCS / "figures" / name)
    replace_block(DOCS / "transfer.md", "<!-- BEGIN lora-summary -->", "<!-- END lora-summary -->", summary(t))
    body = "\n".join(lines) + (f"\n\nSeeds left out for lacking a goal's row: {incomplete}." if incomplete else "") \
        + f"\n\n*From {source}.*"
    replace_block(DOCS / "lora-transfer.md", "<!-- BEGIN generated -->", "<!-- END generated -->", body)
    print(body)


def write_design(store: Path) -> None:
    """The design task's validation table (``--task wordnet``) into docs/lora-transfer.md's design block."""
    from _common import replace_block
    from ftlab.core.sweep import read_store
    from ftlab.experiments.verdicts import t_interval

    records = [{**e["point"], **r} for e in read_store(store).values() for r in e["records"]]
    if not records:
        raise SystemExit(f"{store} holds no finished points: run the design task first")
    t = seed_table(records)
    lines = []
    for pair, tp in t.groupby(level="pair", sort=False):
        tp = tp.droplevel("pair")
        lines += [f"{pair}, WordNet verb glosses, {len(tp)} seeds ({', '.join(str(s) for s in tp.index)}); "
                  "validation accuracy:", "", "| row | mean [95% interval] | paired difference to B probe |",
                  "|---|---|---|"]
        for row in ("A+LoRA", "B probe", "B+LoRA", "ftlab", "ftlab, head only", "ftlab + head data",
                    "ftlab + head data, head only", "naive"):
            if row not in tp or tp[row].isna().all():
                continue
            m, lo, hi = t_interval(tp[row].to_numpy())
            d = "" if row == "B probe" or "B probe" not in tp else \
                "{:+.3f} [{:+.3f}, {:+.3f}]".format(*t_interval((tp[row] - tp["B probe"]).to_numpy()))
            lines.append(f"| {row} | {m:.3f} [{lo:.3f}, {hi:.3f}] | {d} |")
        if {"ftlab + head data", "ftlab"} <= set(tp):
            m, lo, hi = t_interval((tp["ftlab + head data"] - tp["ftlab"]).to_numpy())
            lines.append(f"\nftlab + head data - ftlab: {m:+.3f} [{lo:+.3f}, {hi:+.3f}].")
        heal = sorted((c for c in tp.columns if "@" in c), key=lambda c: (c.split("@")[0], int(c.split("@")[1])))
        if heal:
            lines += ["", "| heal row@steps | mean [95% interval] | paired difference to B+LoRA |", "|---|---|---|"]
            for row in heal:
                m, lo, hi = t_interval(tp[row].to_numpy())
                d = "" if "B+LoRA" not in tp else \
                    "{:+.3f} [{:+.3f}, {:+.3f}]".format(*t_interval((tp[row] - tp["B+LoRA"]).to_numpy()))
                lines.append(f"| {row} | {m:.3f} [{lo:.3f}, {hi:.3f}] | {d} |")
        lines.append("")
    body = "\n".join(lines) + f"\n*From {store.name}: {len(records)} records.*"
    replace_block(DOCS / "lora-transfer.md", "<!-- BEGIN design -->", "<!-- END design -->", body)
    print(body)


if __name__ == "__main__":
    main()
