"""``ftlab reproduce``: the reproduction report."""

from __future__ import annotations

from pathlib import Path

import click

from ftlab.core.validate import check_workers
from ftlab.report import FULL_SCALE, SECTIONS, ReportContext, run_report


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("sections", nargs=-1, type=click.Choice(list(SECTIONS)))
@click.option("--full", is_flag=True, help=f"Instead of the quick runs: {FULL_SCALE}.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True, help="Folder for report.md, its tables and figures.")
@click.option("--figure", "figures", multiple=True,
              help="Only these named figures of the chosen sections (repeatable), e.g. tasks, fig3; an unknown "
                   "name is refused.")
@click.option("--workers", type=int, default=None, help="Local worker processes, >= 1 (default: all cores).")
@click.option("--scheduler", default=None, help="Dask scheduler address (tcp://host:port) for the sweeps.")
@click.option("--seed", type=int, default=0, show_default=True, help="Base seed.")
def reproduce(sections, full, out, figures, workers, scheduler, seed):
    """Run the reproduction report and write OUT/report.md.

    \b
    Sections (default: all, in this order):
      dln       the theory paper's diagonal-network claims, one verdict each
      replica   replica learning curves vs simulation in the authors' draft-figure layout
      deep      init-scale interventions on ResNets and a Transformer (CPU scale)
      transfer  BiCo vs baselines vs direct fine-tuning on real data and weights

    Verdicts: reproduced / reversed / no effect / inconclusive, each with its interval.
    Sweeps resume: rerunning after an interruption recomputes only what was not finished.
    A second run on the same --out is refused while the first is running.
    """
    check_workers(workers)
    ctx = ReportContext(out_dir=out, full=full, figures=tuple(figures) or None, workers=workers,
                        scheduler=scheduler, seed=seed)
    path, status = run_report(ctx, list(sections) or None)
    for name, st in status.items():
        click.echo(f"{name:10s} {st}", err=True)
    click.echo(str(path))
    if any(s.startswith("failed") for s in status.values()):
        raise SystemExit(1)
