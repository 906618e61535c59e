"""ftlab: the science and practice of the pretrain -> fine-tune pipeline.

Three parts, one house:

* :mod:`ftlab.dln` -- exact theory and simulation of fine-tuning in diagonal linear networks
  (Anguita et al. 2026, arXiv 2602.20062). numpy/scipy only.
* :mod:`ftlab.deep` -- initialization-scale interventions and representation geometry for any
  PyTorch model, and CPU-scale versions of the paper's deep-network experiments.
* :mod:`ftlab.transfer` -- training-free transfer of task vectors between base models of other
  width, depth or pretraining (BiCo, arXiv 2605.28444, and its baselines).

Shared pieces: :mod:`ftlab.core.geometry` (PR, ENSD, CKA, Procrustes), :mod:`ftlab.core.stats` (streaming
float64 accumulators), :mod:`ftlab.core.hooks` (activation / gradient capture), :mod:`ftlab.core.sweep`
(resumable sweeps on a process pool or Dask), :mod:`ftlab.core.results` (atomic, self-describing I/O).

Importing :mod:`ftlab` imports neither torch nor any other heavy dependency.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
