"""Run the transfer benchmark (or its pilot), record its wall time, and regenerate its docs from the records.

    python benchmarks/bench_transfer_benchmark.py                 # the quick run (`ftlab reproduce transfer`), timed
    python benchmarks/bench_transfer_benchmark.py --pilot         # the premise pilot (recipes on validation data)
    python benchmarks/bench_transfer_benchmark.py --full          # the recorded run (hold the CPU lock: flock ...)
    python benchmarks/bench_transfer_benchmark.py --from-records docs/transfer-benchmark-records.csv
        # no training: every table, figure and verdict of docs/transfer-benchmark.md from the committed records

The sweep stores are ``<out>/transfer/runs-{quick,full}.jsonl`` (the files ``ftlab reproduce transfer --out <out>``
uses, so a report afterwards reuses the results) and ``<out>/transfer/pilot-{vision,text}.jsonl``; all resume.
Writes: docs/transfer-benchmark-records.csv (full run: the compact per-seed records),
docs/transfer-benchmark-pilot.csv (pilot), the generated blocks of docs/transfer-benchmark.md
(``<!-- BEGIN generated pilot -->``, ``<!-- BEGIN generated full -->``), docs/figures/transfer-{vision,text,family}.png
and the ``transfer-benchmark`` section of docs/benchmarks.md (wall times).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from _common import machine, replace_block, write_section

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RECORDS = DOCS / "transfer-benchmark-records.csv"
PILOT = DOCS / "transfer-benchmark-pilot.csv"
PILOT_SEEDS = 3  # the internal pilot: the recorded run's first seeds size the rest
DEFAULTS = DOCS / "transfer-defaults-pilot.csv"  # benchmarks/pilot_transfer_defaults.py


def defaults_markdown(pilot) -> str:
    """The validation pilot of ftlab's defaults: per combination of centring, copy rule and repair, the validation
    accuracy with alpha searched and at alpha = 1, averaged over the design pairs and seeds (text pairs keep no running
    statistics: their rows without repair stand for every repair mode)."""
    import pandas as pd

    vis = pilot[pilot["pair"].str.startswith("lite")]
    text = pilot[~pilot["pair"].str.startswith("lite")]
    cols = sorted(set(zip(pilot["pair"], pilot["seed"])))
    rows = []
    for (center, copies, repair), g in vis.groupby(["center", "copies", "repair"]):
        t = text[(text["center"] == center) & (text["copies"] == copies)]
        both = pd.concat([g, t])
        per = {(r.pair, r.seed): r.val_searched for r in both.itertuples()}
        rows.append((both["val_searched"].mean(), center, copies, repair, both["val_alpha1"].mean(), per))
    lines = ["| centred | copies | repair | " + " | ".join(f"{p} s{s}" for p, s in cols)
             + " | mean, α searched | mean, α = 1 |", "|---|---|---|" + "---|" * (len(cols) + 2)]
    for mean, center, copies, repair, at1, per in sorted(rows, key=lambda r: -r[0]):
        cells = " | ".join(f"{100 * per[c]:.1f}" if c in per else "–" for c in cols)
        lines.append(f"| {'yes' if center else 'no'} | {copies} | {repair} | {cells} | **{100 * mean:.1f}** | "
                     f"{100 * at1:.1f} |")
    return ("Validation accuracy (%) of BiCo on the design task of each design pair and seed, α searched over 0, 0.5, "
            "…, 3 (`benchmarks/pilot_transfer_defaults.py`, records in docs/transfer-defaults-pilot.csv):\n\n"
            + "\n".join(lines))


def pilot_markdown(pilot, records) -> str:
    """The premise pilot (recipes and gaps on validation, test beside) and the power plan from the first seeds."""
    from ftlab.experiments.transfer_accuracy.claims import PRIMARIES
    from ftlab.experiments.transfer_accuracy.pilot import choose_recipes
    from ftlab.experiments.transfer_accuracy.records import gap_halfwidth, power_plan

    parts = []
    if pilot is not None and len(pilot):
        lines = ["| family | encoder | task | training set | lr | epochs | probe val | fine-tuned val | gap val | "
                 "gap test |", "|---|---|---|---|---|---|---|---|---|---|"]
        for _, r in pilot.sort_values(["kind", "task", "n_train", "encoder", "lr"]).iterrows():
            lines.append(f"| {r.kind} | {r.encoder} | {r.task} | {r.n_train} | {r.lr:g} | {r.epochs} | "
                         f"{100 * r.probe_val:.1f} | {100 * r.finetuned_val:.1f} | "
                         f"{100 * (r.finetuned_val - r.probe_val):+.1f} | {100 * (r.finetuned_test - r.probe_test):+.1f} |")
        parts.append("**Premise pilot** (seed 0; accuracies in %; the recipe is chosen by the fine-tuned models' mean "
                     "validation accuracy):\n\n" + "\n".join(lines))
        ch = choose_recipes(pilot, {"vision": ("lite1", "lite2"), "text": ("minilm_l6", "mpnet_base")})
        rows = ["| family | task | training set | chosen lr | epochs | validation gap per target (pts) | premise |",
                "|---|---|---|---|---|---|---|"]
        for _, r in ch.iterrows():
            gaps = ", ".join(f"{k} {100 * v:+.1f}" for k, v in r.gap_val.items())
            rows.append(f"| {r.kind} | {r.task} | {r.n_train} | {r.lr:g} | {r.epochs} | {gaps} | "
                        f"{'holds' if r.premise else 'fails'} |")
        parts.append("\n".join(rows))
    if records is not None and len(records):
        first = records[records["seed"] < PILOT_SEEDS]
        plan = power_plan(first)
        lines = ["| primary | pilot seeds | mean effect | per-seed sd | powered for | seeds for 80% power |",
                 "|---|---|---|---|---|---|"]
        for _, r in plan.iterrows():
            unit = "" if r.claim == "half_gap" else " pts"
            k = 1.0 if unit == "" else 100.0
            lines.append(f"| {r.claim} | {r.pilot_seeds} | {k * r['mean']:+.2f}{unit} | {k * r.sd:.2f}{unit} | "
                         f"{k * r.effect:.2f}{unit} | {r.seeds_needed} |")
        parts.append(f"**Seeds by power** (the recorded run's first {PILOT_SEEDS} seeds as an internal pilot; the paired "
                     f"t-test's power at level 0.05 / {len(PRIMARIES)}, a lower bound on Holm's):\n\n"
                     + "\n".join(lines))
        n = int(records["seed"].nunique())
        hw = gap_halfwidth(first, n)
        if len(hw):
            parts.append("Projected half-width of the 95% interval of BiCo's gap closed at "
                         f"{n} seeds: " + ", ".join(f"{r.setting} ±{100 * r.halfwidth:.0f}%" for _, r in hw.iterrows())
                         + ".")
    return "\n\n".join(parts)


def regenerate(records, *, wall_min: float | None, label: str) -> None:
    """The generated blocks of docs/transfer-benchmark.md and the figures, from records alone."""
    import pandas as pd

    from ftlab.experiments.transfer_accuracy.records import summarize
    from ftlab.experiments.transfer_accuracy.run import ALPHA_GRID
    from ftlab.report.transfer import render, write_figures

    sm = summarize(records, alpha_top=max(ALPHA_GRID))
    figs = write_figures(sm, DOCS / "figures", prefix="transfer-")
    head = (f"*Generated from docs/transfer-benchmark-records.csv by `benchmarks/bench_transfer_benchmark.py "
            f"--from-records` ({label}, {time.strftime('%Y-%m-%d')}"
            + (f", wall time of the run {wall_min:.0f} min on 2 workers" if wall_min else "") + ").*")
    body = render(sm, figures={k: f"figures/{Path(v).name}" for k, v in figs.items()})
    replace_block(DOCS / "transfer-benchmark.md", "<!-- BEGIN generated full -->", "<!-- END generated full -->",
                  head + "\n\n" + body)
    if DEFAULTS.exists():
        replace_block(DOCS / "transfer-benchmark.md", "<!-- BEGIN generated defaults -->",
                      "<!-- END generated defaults -->", defaults_markdown(pd.read_csv(DEFAULTS)))
    pilot = pd.read_csv(PILOT) if PILOT.exists() else None
    replace_block(DOCS / "transfer-benchmark.md", "<!-- BEGIN generated pilot -->", "<!-- END generated pilot -->",
                  pilot_markdown(pilot, records))


def pilot_plan(part: str) -> list[dict]:
    """The pilot's points: ``vision`` (the two targets, three learning rates), ``text`` (MiniLM-L6, the target of
    MiniLM-L3 -> L6: every noun supersense, 400 glosses, three learning rates), ``mpnet``
    (all-mpnet-base-v2 on the chosen text design, two learning rates) and ``sources`` (the sources on the chosen
    designs)."""
    from ftlab.experiments.transfer_accuracy.pilot import pilot_points
    from ftlab.experiments.transfer_accuracy.run import TEXT_DESIGN, VISION_DESIGN

    v = dict(n_train=(VISION_DESIGN["n_train"],), n_val=VISION_DESIGN["n_val"], n_test=VISION_DESIGN["n_test"],
             size=VISION_DESIGN["resolution"])
    t = dict(n_val=TEXT_DESIGN["text_n_val"], n_test=TEXT_DESIGN["text_n_test"], size=TEXT_DESIGN["text_max_length"])
    if part == "vision":
        return pilot_points("vision", ["lite1", "lite2"], list(VISION_DESIGN["image_tasks"]), **v)
    if part == "text":
        return pilot_points("text", ["minilm_l6"], ["wordnet_nouns_all"], n_train=(400,), **t)
    chosen = list(TEXT_DESIGN["text_tasks"])
    epochs = TEXT_DESIGN["text_finetune"].epochs
    if part == "mpnet":
        return pilot_points("text", ["mpnet_base"], chosen, n_train=(TEXT_DESIGN["text_n_train"],), **t,
                            recipes=((0.03, epochs), (0.1, epochs)))
    lr_v, lr_t = VISION_DESIGN["vision_finetune"], TEXT_DESIGN["text_finetune"]
    return (pilot_points("vision", ["lite0"], list(VISION_DESIGN["image_tasks"]), **v, recipes=((lr_v.lr, lr_v.epochs),))
            + pilot_points("text", ["minilm_l3"], chosen, n_train=(TEXT_DESIGN["text_n_train"],), **t,
                           recipes=((lr_t.lr, lr_t.epochs),)))


def run_pilot(out: Path, workers: int, parts: list[str]) -> None:
    """Run the pilot's ``parts`` (resumable store) and merge their rows into docs/transfer-benchmark-pilot.csv."""
    import pandas as pd

    from ftlab.core.results import atomic_write_text
    from ftlab.core.sweep import run_sweep
    from ftlab.experiments.transfer_accuracy.pilot import premise_point

    frames = [pd.read_csv(PILOT)] if PILOT.exists() else []
    for part in parts:
        frames.append(run_sweep(premise_point, pilot_plan(part), store=out / "transfer" / "pilot.jsonl",
                                workers=workers, desc=f"pilot {part}").drop(columns=["n_val", "n_test"]))
    keys = ["kind", "encoder", "task", "lr", "epochs", "seed", "n_train", "size"]
    df = pd.concat(frames, ignore_index=True).drop_duplicates(keys, keep="last")
    atomic_write_text(PILOT, df.to_csv(index=False, float_format="%.4f"))


def record_wall(out: Path, label: str, n_points: int, wall: float, loads: tuple[float, float], workers: int) -> None:
    from ftlab.core.results import atomic_write_text

    runs_file = out / "transfer" / "walls.json"
    walls = json.loads(runs_file.read_text()) if runs_file.exists() else {}
    walls[label] = {"date": time.strftime("%Y-%m-%d"), "points": n_points, "load": f"{loads[0]:.1f} / {loads[1]:.1f}",
                    "wall_min": round(wall / 60, 1), "target": "under 10 min" if label == "quick" else "at most 2 h"}
    atomic_write_text(runs_file, json.dumps(walls, indent=1))
    rows = "".join(f"| {k} | {v['date']} | {v['points']} | {v['load']} | **{v['wall_min']:.1f} min** | {v['target']} |\n"
                   for k, v in walls.items())
    write_section("transfer-benchmark", (
        "## Transfer benchmark (`ftlab reproduce transfer`)\n\n"
        f"`benchmarks/bench_transfer_benchmark.py`, {workers} worker processes with 1 torch thread each; {machine()}.\n\n"
        "| run | date | points | load average (start / end) | wall time | target |\n|---|---|---|---|---|---|\n" + rows
        + "\nA point is one (task, seed) of the EfficientNet pairs (each model fine-tuned once, every pair "
        "transferred), one (pair, task, seed) of text, or one (task, seed) of the controlled ViT family. The machine "
        "was shared with other jobs during the recorded runs (load average above)."))


def from_store(store: Path, *, wall_min: float | None) -> None:
    """Records of the finished points of a full run's sweep store (the run may still be going), then the docs."""
    import pandas as pd

    from ftlab.core.sweep import read_store
    from ftlab.experiments.transfer_accuracy.records import read_records, write_records
    from ftlab.experiments.transfer_accuracy.run import full_config

    planned = full_config().points()
    keys = {(p["kind"], p["pair"], p["task"], p["seed"]) for p in planned}
    done = {k: e for k, e in read_store(store).items()
            if (e["point"]["kind"], e["point"]["pair"], e["point"]["task"], e["point"]["seed"]) in keys}
    rows = [{**{k: v for k, v in e["point"].items() if k not in ("config", "cache", "pair", "kind")}, **r}
            for e in done.values() for r in e["records"]]
    total = len(planned)
    write_records(pd.DataFrame(rows), RECORDS)
    label = "full run" if len(done) >= total else f"partial full run: {len(done)} of {total} points"
    regenerate(read_records(RECORDS), wall_min=wall_min, label=label)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--full", action="store_true", help="the recorded run")
    mode.add_argument("--pilot", nargs="+", choices=("vision", "text", "mpnet", "sources"),
                      help="the premise pilot, in parts")
    mode.add_argument("--from-records", type=Path, metavar="CSV", help="regenerate the docs from records, no training")
    mode.add_argument("--from-store", type=Path, metavar="JSONL",
                      help="write the records of the finished points of a (partial) full run's store, then the docs")
    ap.add_argument("--out", type=Path, default=Path("results"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--recorded-wall", type=float, default=None, metavar="MIN",
                    help="with --from-records: the wall time of the run that made them (minutes), for the page")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    if args.from_records is not None:
        from ftlab.experiments.transfer_accuracy.records import read_records

        regenerate(read_records(args.from_records), wall_min=args.recorded_wall, label="full run")
        return
    if args.pilot:
        run_pilot(args.out, args.workers, args.pilot)
        return
    if args.from_store is not None:
        from_store(args.from_store, wall_min=args.recorded_wall)
        return
    from ftlab.experiments.transfer_accuracy.records import read_records, write_records
    from ftlab.experiments.transfer_accuracy.run import full_config, quick_config, run_benchmark

    cfg = full_config() if args.full else quick_config()
    label = "full" if args.full else "quick"
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    raw = run_benchmark(cfg, store=args.out / "transfer" / f"runs-{label}.jsonl", workers=args.workers)
    wall = time.perf_counter() - t0
    n_points = len(cfg.points())
    print(f"{label} transfer benchmark: {wall:.0f} s for {n_points} points; skipped pairs: "
          f"{raw.attrs.get('skipped_pairs') or 'none'}")
    record_wall(args.out, label, n_points, wall, (load0, os.getloadavg()[0]), args.workers)
    if args.full:
        write_records(raw, RECORDS)
        regenerate(read_records(RECORDS), wall_min=wall / 60, label="full run")


if __name__ == "__main__":
    main()
