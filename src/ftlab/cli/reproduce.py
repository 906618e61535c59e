"""``ftlab reproduce``: the reproduction report."""

from __future__ import annotations

from pathlib import Path

import click

from ftlab.report import SECTIONS, ReportContext, run_report


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("sections", nargs=-1, type=click.Choice(list(SECTIONS)))
@click.option("--full", is_flag=True, help="Larger runs (an hour or more per section on 2 cores) instead of the quick ones.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True, help="Folder for report.md, its tables and figures.")
@click.option("--figure", "figures", multiple=True,
              help="Only these named figures of the chosen sections (repeatable), e.g. fig3, fig4.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Local worker processes (default: all cores).")
@click.option("--scheduler", default=None, help="Dask scheduler address (tcp://host:port) for the sweeps.")
@click.option("--seed", type=int, default=0, show_default=True, help="Base seed.")
def reproduce(sections, full, out, figures, workers, scheduler, seed):
    """Run the reproduction report and write OUT/report.md.

    \b
    Sections (default: all, in this order):
      dln       regime map of l-order/PD; gradient flow vs implicit bias
      replica   replica learning curves vs simulation; the paper's diagonal-net figures
      deep      init-scale interventions on a ResNet and a Transformer (CPU scale)
      transfer  BiCo vs baselines vs direct fine-tuning on real data and weights

    Sweeps resume: rerunning after an interruption recomputes only what was not finished.
    """
    ctx = ReportContext(out_dir=out, full=full, figures=tuple(figures) or None, workers=workers,
                        scheduler=scheduler, seed=seed)
    path, status = run_report(ctx, list(sections) or None)
    for name, st in status.items():
        click.echo(f"{name:10s} {st}", err=True)
    click.echo(str(path))
    if any(s.startswith("failed") for s in status.values()):
        raise SystemExit(1)
