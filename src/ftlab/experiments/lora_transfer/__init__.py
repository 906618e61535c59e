"""A LoRA adapter carried to another base, as a practitioner uses it: accuracy of the written adapter and of a
short heal, against the adapter copied as is, the naive transfer, the target's linear probe and a LoRA trained
on the target directly.

:mod:`~ftlab.experiments.lora_transfer.study` runs one seed of one (task, pair) into an append-only store
(resumable: finished arms are skipped); :mod:`~ftlab.experiments.lora_transfer.table` turns the store into the
tables of docs/lora-transfer.md (means with Student-t intervals over seeds, paired differences by seed).
"""

from ftlab.experiments.lora_transfer.study import ARMS, PAIRS, StudyConfig, run_seed
from ftlab.experiments.lora_transfer.table import heal_table, summary_table

__all__ = ["ARMS", "PAIRS", "StudyConfig", "heal_table", "run_seed", "summary_table"]
