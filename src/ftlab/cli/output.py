"""Shared ``--format table|json|csv`` output for CLI commands that print records."""

from __future__ import annotations

import json

import click

from ftlab.core.results import to_jsonable

FORMATS = ("table", "json", "csv")

format_option = click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="table",
    show_default=True,
    help="Output format: an aligned table, a JSON list of records, or CSV.",
)


def emit(records: list[dict], fmt: str, *, float_digits: int = 6, exact: tuple[str, ...] = ()) -> None:
    """Print ``records`` (a list of flat dicts) to stdout in the chosen format.

    Tables round floats to ``float_digits`` significant digits, except the ``exact`` columns
    (values a user will paste back into a command, e.g. an advised lambda), printed in full
    round-trip precision. JSON and CSV always carry full precision.
    """
    import pandas as pd

    records = to_jsonable(records)
    if fmt == "json":
        click.echo(json.dumps(records, indent=2))
        return
    df = pd.DataFrame(records)
    if fmt == "csv":
        click.echo(df.to_csv(index=False), nl=False)
        return
    for col in exact:
        if col in df:
            df[col] = [repr(float(v)) if isinstance(v, float) else v for v in df[col]]
    with pd.option_context("display.max_columns", None, "display.width", 200):
        click.echo(df.to_string(index=False, float_format=lambda v: f"{v:.{float_digits}g}"))
