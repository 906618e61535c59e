"""``ftlab explore``: a local page on which the theory of :mod:`ftlab.dln` moves with its knobs.

The regimes, l-order, PD, the implicit-bias potential and the replica learning curve E_g(alpha)
(Anguita et al. 2026, arXiv 2602.20062) are redrawn as c, lambda, gamma, the task statistics and
alpha change; the advisor and simulated networks run on request without blocking the controls.

* :mod:`ftlab.explore.knobs`: one validated setting of the page (:class:`~ftlab.explore.knobs.Knobs`).
* :mod:`ftlab.explore.views`: what the page draws, as JSON-able dicts computed by :mod:`ftlab.dln`.
* :mod:`ftlab.explore.jobs`: worker processes and background jobs (advisor, simulations).
* :mod:`ftlab.explore.server`: the local HTTP server (standard library) and its JSON API; the page
  itself is ``static/`` (its own script, plotly.js served from the installed ``plotly`` package).

Importing this package imports neither the web server nor plotly (``ftlab.explore.server`` does).
"""
