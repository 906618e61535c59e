"""ftlab's studies, built on top of the library (the library never imports them).

* :mod:`ftlab.experiments.training` -- the one training loop and evaluation function;
* :mod:`ftlab.experiments.deep_claims` -- the ResNet and Transformer studies of the deep-network claims;
* :mod:`ftlab.experiments.transfer_accuracy` -- the accuracy benchmark of task-vector transfer.

The reproduction report (:mod:`ftlab.report`) runs them. See docs/architecture.md.
"""
