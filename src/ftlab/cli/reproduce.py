"""``ftlab reproduce``: the reproduction report."""

from __future__ import annotations

from pathlib import Path

import click

from ftlab.core.validate import check_int, check_workers
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
    A section's files and its part of report.md are replaced together, only when it finished:
    a rerun that fails keeps the earlier complete section (the report says the rerun failed).
    Exit status: 0 all sections ok or skipped, 2 a section failed on the input or the machine
    (e.g. a full disk), 1 a section failed on a defect of ftlab.
    A second run on the same --out is refused while the first is running.
    """
    check_workers(workers)
    check_int("seed", seed, 0)
    ctx = ReportContext(out_dir=out, full=full, figures=tuple(figures) or None, workers=workers,
                        scheduler=scheduler, seed=seed)
    path, status = run_report(ctx, list(sections) or None)
    for name, st in status.items():
        click.echo(f"{name:10s} {st}", err=True)
    if path is not None:
        click.echo(str(path))
    failed = [s for s in status.values() if not s.startswith(("ok", "skipped"))]
    if failed:
        raise SystemExit(1 if any("(internal error)" in s for s in failed) else 2)
