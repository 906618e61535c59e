"""The LoRA-transfer study: a practitioner's adapter carried from MiniLM-L3 to MiniLM-L6 (and, given the CPU time,
from MiniLM-L6 to MPNet), with ftlab's defaults, the copied adapter, the naive transfer, B's linear probe, a LoRA
trained on B, and a short heal (:mod:`ftlab.experiments.lora_transfer`).

    python benchmarks/lora_transfer_study.py design 0 1        # design seeds: WordNet verbs, validation split
    python benchmarks/lora_transfer_study.py judge 0 1 2       # judge seeds: WordNet nouns, test split
    python benchmarks/lora_transfer_study.py tables            # docs/lora-transfer.md tables from the store

Records are appended to docs/lora-transfer-records.jsonl (one line per arm and seed; a rerun skips what is
there); trained adapters and converted folders are kept in ``--cache`` (default ``.cache/lora-transfer``, ignored
by git). The design run chose the defaults of ``ftlab.transfer.heads`` (rule and alpha) on the validation split of one task;
the judge run scores them on the test split of another task, never used to choose them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "docs" / "lora-transfer-records.jsonl"
DOC = ROOT / "docs" / "lora-transfer.md"
DESIGN_TASK, JUDGE_TASK = "wordnet_verbs", "wordnet_nouns"
JUDGE_ARMS = ("a_lora", "probe", "probe_cal", "direct", "copy", "naive", "bico_delta", "ftlab")


def tables() -> str:
    """The generated part of docs/lora-transfer.md."""
    from ftlab.experiments.lora_transfer.study import load_store
    from ftlab.experiments.lora_transfer.table import gap_closed, heal_table, markdown, summary_table

    recs = load_store(STORE)
    out = []
    for pair in ("minilm_l3->minilm_l6", "minilm_l6->mpnet_base"):
        design = [r for r in recs if r["pair"] == pair and r["task"] == DESIGN_TASK and r["split"] == "val"]
        judge = [r for r in recs if r["pair"] == pair and r["task"] == JUDGE_TASK and r["split"] == "test"]
        if not design and not judge:
            continue
        if design:
            arms = ["probe"] + sorted({r["arm"] for r in design if r["arm"].startswith("ftlab ")}) + ["a_lora"]
            out.append(f"### {pair}: design ({DESIGN_TASK}, validation split)\n\n" + markdown(summary_table(design, arms)))
        if judge:
            out.append(f"### {pair}: judge ({JUDGE_TASK}, test split)\n\n" + markdown(summary_table(judge, JUDGE_ARMS)))
            out.append(f"Gap from B's linear probe to the LoRA trained on B closed by ftlab's adapter (ratio of seed "
                       f"means): {100 * gap_closed(judge):.0f}%.\n")
            steps = sorted({r["k"] for r in judge if r["arm"] in ("heal", "fresh")})
            out.append("Heal: k steps of LoRA training on the calibration rows (accuracy %, 95% interval over seeds; "
                       "differences paired by seed)\n\n" + markdown(heal_table(judge, steps)))
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["design", "judge", "tables"])
    ap.add_argument("seeds", nargs="*", type=int)
    ap.add_argument("--pair", default="minilm_l3->minilm_l6")
    ap.add_argument("--cache", default=str(ROOT / ".cache" / "lora-transfer"))
    args = ap.parse_args()
    if args.what == "tables":
        import sys

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from _common import replace_block

        replace_block(DOC, "<!-- BEGIN tables -->", "<!-- END tables -->", tables())
        print(f"wrote {DOC}")
        return
    from ftlab.experiments.lora_transfer.study import StudyConfig, run_seed

    for seed in args.seeds:
        design = args.what == "design"
        cfg = StudyConfig(task=DESIGN_TASK if design else JUDGE_TASK, pair=args.pair, seed=seed,
                          split="val" if design else "test", design=design)
        run_seed(cfg, STORE, args.cache, log=lambda s: print(s, flush=True))


if __name__ == "__main__":
    main()
