"""``ftlab theory``: the diagonal-network theory of fine-tuning (arXiv 2602.20062).

Subcommands live in ``ftlab.cli.theory_dln`` (metrics, simulate) and
``ftlab.cli.theory_replica`` (curve, advise) and are imported on first use. The flags they share
are defined here once: :func:`scales_options` turns ``--c --lam --gamma`` into one validated
:class:`~ftlab.dln.model.InitScales` (``scales``), :func:`task_options` turns the task flags into one
:class:`~ftlab.dln.tasks.TaskSpec` (``spec``).
"""

from __future__ import annotations

import functools

import click

from ftlab.cli.main import LazyGroup

THEORY_COMMANDS = {
    "metrics": ("ftlab.cli.theory_dln:metrics", "l-order, pretraining dependence (PD) and regime of a setting."),
    "simulate": ("ftlab.cli.theory_dln:simulate", "Simulate PT+FT gradient flow; FT error vs the implicit-bias solution."),
    "curve": ("ftlab.cli.theory_replica:curve", "Replica learning curve E_g(alpha), optionally against simulations."),
    "advise": ("ftlab.cli.theory_replica:advise", "Best initialization (c, lambda, gamma) for given task statistics."),
}

#: ``--c --lam --gamma``: (default, help) in every ``ftlab theory`` command.
SCALE_FLAGS = {
    "c": (1e-3, "PT absolute init scale c (> 0)."),
    "lam": (0.0, "PT relative scale lambda of the first layer against the readout, normalized to [-1, 1] "
                 "(authors' code: lambda_u = lam * c)."),
    "gamma": (0.0, "FT readout re-initialization scale gamma (>= 0)."),
}

#: The task flags, turned into one TaskSpec by :func:`task_options`.
TASK_FLAGS = [
    click.option("--rho-pt", type=float, default=0.1, show_default=True, help="PT teacher sparsity in [0, 1]."),
    click.option("--rho-ft", type=float, default=None, help="FT teacher sparsity in [0, 1]  [default: 0.1]."),
    click.option("--overlap", type=float, default=None,
                 help="omega = |S_PT ∩ S_FT| / |S_FT|  [default: 1]. Or give --rho-shared and --rho-new."),
    click.option("--rho-shared", type=float, default=None, help="P(FT-active | PT-active); with --rho-new."),
    click.option("--rho-new", type=float, default=None, help="P(FT-active | PT-inactive); with --rho-shared."),
    click.option("--noise", type=float, default=0.0, show_default=True, help="FT label-noise std sigma."),
    click.option("--pt-noise", type=float, default=0.0, show_default=True, help="PT label-noise std (with --alpha-pt)."),
    click.option("--pt-magnitude", type=click.Choice(["fixed", "gaussian"]), default="fixed", show_default=True,
                 help="PT teacher values: a_pt = 1 on the support (authors' code) or N(0, 1/rho_pt) [U]."),
]

alpha_pt_option = click.option("--alpha-pt", type=float, default=None,
                               help="PT samples per dimension (imperfect PT); omitted = exact infinite-PT oracle.")


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


def _scale_flags(f, *, multiple: bool):
    for name, (default, text) in reversed(SCALE_FLAGS.items()):
        f = click.option(f"--{name}", type=float, default=(default,) if multiple else default, multiple=multiple,
                         show_default=True, help=text + (" Repeatable." if multiple else ""))(f)
    return f


def repeatable_scale_options(f):
    """``--c --lam --gamma``, each repeatable (a tuple of floats per flag)."""
    return _scale_flags(f, multiple=True)


def scales_options(f):
    """``--c --lam --gamma``, passed to the command as one validated ``scales`` (InitScales)."""

    @functools.wraps(f)
    def command(*args, c, lam, gamma, **kw):
        from ftlab.dln.model import InitScales

        return f(*args, scales=InitScales(c=c, lam=lam, gamma=gamma), **kw)

    return _scale_flags(command, multiple=False)


def task_spec(*, rho_pt, rho_ft, overlap, rho_shared, rho_new, noise, pt_noise, pt_magnitude):
    """Build a TaskSpec from the task flags (either --rho-ft/--overlap or --rho-shared/--rho-new)."""
    from ftlab.dln.tasks import TaskSpec

    extra = {"noise": noise, "pt_noise": pt_noise, "pt_magnitude": pt_magnitude}
    if rho_shared is not None or rho_new is not None:
        if rho_shared is None or rho_new is None or overlap is not None or rho_ft is not None:
            raise ValueError("rho_shared/rho_new: give both, and neither --overlap nor --rho-ft with them")
        return TaskSpec.from_conditional(rho_pt=rho_pt, rho_shared=rho_shared, rho_new=rho_new, **extra)
    return TaskSpec(rho_pt=rho_pt, rho_ft=0.1 if rho_ft is None else rho_ft, overlap=1.0 if overlap is None else overlap,
                    **extra)


def task_options(f):
    """The task flags, passed to the command as one validated ``spec`` (TaskSpec)."""

    @functools.wraps(f)
    def command(*args, rho_pt, rho_ft, overlap, rho_shared, rho_new, noise, pt_noise, pt_magnitude, **kw):
        spec = task_spec(rho_pt=rho_pt, rho_ft=rho_ft, overlap=overlap, rho_shared=rho_shared, rho_new=rho_new,
                         noise=noise, pt_noise=pt_noise, pt_magnitude=pt_magnitude)
        return f(*args, spec=spec, **kw)

    for option in reversed(TASK_FLAGS):
        command = option(command)
    return command


#: Memory of one simulated run's parameters and record while a sweep holds them (bytes, generous).
RUN_BYTES = 4096


def check_runs(seeds: int, n_alphas: int) -> None:
    """Refuse, before any work, ``--seeds`` x alpha values whose runs' records cannot fit in memory."""
    from ftlab.core.validate import check_memory

    check_memory(f"--seeds {seeds} x {n_alphas} alpha value(s) ({seeds * n_alphas:,} simulated runs)",
                 RUN_BYTES * seeds * n_alphas, hint="reduce --seeds")


def setting_record(spec, scales, alpha_pt) -> dict:
    """The inputs every record of ``ftlab theory simulate / curve`` starts with, in this order."""
    return {"c": scales.c, "lam": scales.lam, "gamma": scales.gamma, "rho_pt": spec.rho_pt, "rho_ft": spec.rho_ft,
            "overlap": spec.overlap, "rho_shared": spec.rho_shared, "rho_new": spec.rho_new, "alpha_pt": alpha_pt}
