"""Entry point of the ``ftlab`` command.

Command groups live in their own modules and are imported only when used, so ``ftlab theory``
never imports torch. Errors from bad input (``ValueError``, missing files, unreadable
checkpoints) are printed as one line on stderr with exit status 2 -- no traceback; set
``FTLAB_DEBUG=1`` to see it.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

import click

from ftlab import __version__
from ftlab.core.progress import set_quiet

# name -> "module:attribute" of a click command or group
COMMANDS = {
    "theory": ("ftlab.cli.theory:theory", "Diagonal-network theory: metrics, simulation, learning curves, advice."),
    "deep": ("ftlab.cli.deep:deep", "Init-scale interventions and geometry on deep networks."),
    "transfer": ("ftlab.cli.transfer:transfer", "Carry a task vector from one base model to another (BiCo)."),
    "reproduce": ("ftlab.cli.reproduce:reproduce", "Write the reproduction report (results/report.md)."),
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use.

    ``lazy_commands`` maps a command name to ``("module:attribute", short help)``.
    """

    def __init__(self, *args, lazy_commands: dict[str, tuple[str, str]] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy_commands = lazy_commands if lazy_commands is not None else COMMANDS

    def list_commands(self, ctx):
        return sorted(set(self.lazy_commands) | set(self.commands))

    def get_command(self, ctx, name):
        if name in self.commands:
            return self.commands[name]
        if name not in self.lazy_commands:
            return None
        mod, attr = self.lazy_commands[name][0].split(":")
        return getattr(importlib.import_module(mod), attr)

    def format_commands(self, ctx, formatter):
        # Short help from the table, without importing every module.
        rows = [(n, self.lazy_commands[n][1] if n in self.lazy_commands else self.commands[n].get_short_help_str())
                for n in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="ftlab")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def cli(quiet: bool, verbose: int) -> None:
    """ftlab: the pretrain -> fine-tune pipeline, in theory and in practice.

    \b
    ftlab theory ...     exact diagonal-network theory (arXiv 2602.20062)
    ftlab deep ...       the same knobs (c, lambda, gamma) on real networks
    ftlab transfer ...   training-free task-vector transfer (BiCo, arXiv 2605.28444)
    ftlab reproduce      the reproduction report, quick by default (--full for paper size)

    Run `ftlab COMMAND --help` for each command's options.
    """
    set_quiet(quiet)
    level = logging.WARNING if verbose == 0 else (logging.INFO if verbose == 1 else logging.DEBUG)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")


def _one_line(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    text = msg[0] if msg else exc.__class__.__name__
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError)) and exc.filename and not msg[1:]:
        text = f"{exc.strerror or exc.__class__.__name__}: {exc.filename}" if exc.strerror else text
    return text


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; bad input exits 2 with a one-line message on stderr."""
    try:
        cli.main(args=argv, prog_name="ftlab", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("ftlab: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except (ValueError, TypeError, FileNotFoundError, PermissionError, IsADirectoryError, KeyError) as exc:
        if os.environ.get("FTLAB_DEBUG"):
            raise
        click.echo(f"ftlab: error: {_one_line(exc)}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        click.echo("ftlab: interrupted (finished points of a sweep are kept; rerun to resume)", err=True)
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()
