"""``ftlab theory``: the diagonal-network theory of fine-tuning (arXiv 2602.20062).

Subcommands live in ``ftlab.cli.theory_dln`` (metrics, simulate) and
``ftlab.cli.theory_replica`` (curve, advise) and are imported on first use.
"""

from __future__ import annotations

import click

from ftlab.cli.main import LazyGroup

THEORY_COMMANDS = {
    "metrics": ("ftlab.cli.theory_dln:metrics", "l-order, pretraining dependence (PD) and regime of a setting."),
    "simulate": ("ftlab.cli.theory_dln:simulate", "Simulate PT+FT gradient flow; FT error vs the implicit-bias solution."),
    "curve": ("ftlab.cli.theory_replica:curve", "Replica learning curve E_g(alpha), optionally against simulations."),
    "advise": ("ftlab.cli.theory_replica:advise", "Best initialization (c, lambda, gamma) for given task statistics."),
}


@click.group(cls=LazyGroup, lazy_commands=THEORY_COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
def theory():
    """Exact theory of fine-tuning in diagonal linear networks.

    \b
    Model: beta = v+ * w+ - v- * w-, pretrained from scale c (absolute) and lambda
    (relative scale of first vs second layer, normalized to [-1, 1]); the readout is
    re-initialized with scale gamma before fine-tuning. Fine-tuning converges to
    argmin Q_k(beta) s.t. X beta = y, with k_d set by c, lambda, gamma and |beta_PT,d|.

    Every subcommand uses the same flag names: --c --lam --gamma --rho-pt --rho-ft
    --overlap (or --rho-shared/--rho-new) --alpha-pt --alpha --dim --seeds --noise.
    """
