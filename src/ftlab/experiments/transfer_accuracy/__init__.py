"""The transfer benchmark: BiCo against its baselines and direct fine-tuning, at CPU scale.

* :mod:`~ftlab.experiments.transfer_accuracy.tasks` -- joint 20-class pretraining data and shifted tasks;
* :mod:`~ftlab.experiments.transfer_accuracy.family` -- the ViT base family, pretrained here and cached;
* :mod:`~ftlab.experiments.transfer_accuracy.finetune` -- the fine-tuning recipe and evaluation;
* :mod:`~ftlab.experiments.transfer_accuracy.text` -- the MiniLM-L6 -> MiniLM-L3 pair on WordNet supersenses;
* :mod:`~ftlab.experiments.transfer_accuracy.run` -- the benchmark driver (resumable sweep);
* :mod:`~ftlab.experiments.transfer_accuracy.table` -- summary table, gap closed, bar chart.

See ``docs/transfer-benchmark.md``.
"""
