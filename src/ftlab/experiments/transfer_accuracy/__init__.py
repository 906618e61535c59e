"""The transfer benchmark: BiCo against its baselines and direct fine-tuning, at CPU scale.

* :mod:`~ftlab.experiments.transfer_accuracy.tasks` -- joint 20-class pretraining data and shifted tasks;
* :mod:`~ftlab.experiments.transfer_accuracy.family` -- the ViT base family, pretrained here and cached;
* :mod:`~ftlab.experiments.transfer_accuracy.finetune` -- the fine-tuning recipe and evaluation;
* :mod:`~ftlab.experiments.transfer_accuracy.pairs`, :mod:`~ftlab.experiments.transfer_accuracy.vision`,
  :mod:`~ftlab.experiments.transfer_accuracy.text`, :mod:`~ftlab.experiments.transfer_accuracy.probe` -- the real
  pretrained pairs, their image and WordNet-gloss tasks, linear-probe heads;
* :mod:`~ftlab.experiments.transfer_accuracy.pilot` -- the premise pilot (recipes chosen on validation data);
* :mod:`~ftlab.experiments.transfer_accuracy.design` -- the benchmark's configuration (what a run measures);
* :mod:`~ftlab.experiments.transfer_accuracy.setup` -- each pair's heads and fine-tunings, built once;
* :mod:`~ftlab.experiments.transfer_accuracy.variants`, :mod:`~ftlab.experiments.transfer_accuracy.compare` -- the
  transfers compared and one pair's records (fits shared, alpha at 1 and searched);
* :mod:`~ftlab.experiments.transfer_accuracy.run` -- the sweep points (resumable);
* :mod:`~ftlab.experiments.transfer_accuracy.claims`, :mod:`~ftlab.experiments.transfer_accuracy.records`,
  :mod:`~ftlab.experiments.transfer_accuracy.table` -- verdicts, compact records, summary tables and figures;
* :mod:`~ftlab.experiments.transfer_accuracy.investigate` -- ftlab's investigation of the alignment.

See ``docs/transfer-benchmark.md``.
"""
