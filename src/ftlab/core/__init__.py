"""The shared core: pieces every part of ftlab uses, depending on no part.

* :mod:`ftlab.core.hooks` -- capture inputs, outputs and output gradients with plain PyTorch hooks;
* :mod:`ftlab.core.stats` -- streaming float64 moments and cross-moments (mergeable);
* :mod:`ftlab.core.geometry` -- participation ratio, ENSD and linear CKA (one formula each);
* :mod:`ftlab.core.validate` -- argument checks with one-line errors;
* :mod:`ftlab.core.sweep` -- the resumable sweep runner (process pool or Dask);
* :mod:`ftlab.core.results` -- atomic, self-describing result files; output folders locked, kept apart
  from the inputs and written as whole output sets;
* :mod:`ftlab.core.usercode` -- the user's own code: importing ``module:function``, telling its errors
  from ftlab's;
* :mod:`ftlab.core.plotting`, :mod:`ftlab.core.progress` -- figures and progress lines.

Import the modules themselves; this package imports nothing (so ``ftlab.dln`` stays free of torch).
See docs/architecture.md for the allowed imports between the parts.
"""
