"""The transfer benchmark: BiCo against its baselines and direct fine-tuning, at CPU scale.

* :mod:`~ftlab.transfer.benchmark.tasks` -- joint 20-class pretraining data and shifted tasks;
* :mod:`~ftlab.transfer.benchmark.family` -- the ViT base family, pretrained here and cached;
* :mod:`~ftlab.transfer.benchmark.finetune` -- the fine-tuning recipe and evaluation;
* :mod:`~ftlab.transfer.benchmark.text` -- the MiniLM-L6 -> MiniLM-L3 pair on WordNet supersenses;
* :mod:`~ftlab.transfer.benchmark.run` -- the benchmark driver (resumable sweep);
* :mod:`~ftlab.transfer.benchmark.table` -- summary table, gap closed, bar chart.

See ``docs/transfer-benchmark.md``.
"""
