"""Entry point of the ``ftlab`` command.

Command groups live in their own modules and are imported only when used, so ``ftlab theory``
never imports torch.

Exit statuses: 0 success; 2 an expected error that is not ftlab's -- bad input (``ValueError``,
including :class:`~ftlab.core.usercode.UserCodeError` for the user's own model, loss, data or module),
a missing, unreadable, malformed or unwritable file or folder, a full disk (``OSError``), a run too
large for the machine (``MemoryError``), or an exception raised in the user's own code (its file and
line are named) -- printed as one line on stderr; 130 interrupted (Ctrl-C), 143 terminated (SIGTERM;
SIGHUP 129): cleanup runs, the line says what happened to the outputs, finished points of sweeps
are kept; 1 anything else, which is a bug in ftlab: one line "internal error" (``-v`` or
``FTLAB_DEBUG=1`` prints the traceback).
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import traceback

import click

from ftlab import __version__
from ftlab.core.progress import set_quiet, set_stage_lines

_VERBOSE = 0

# name -> "module:attribute" of a click command or group
COMMANDS = {
    "theory": ("ftlab.cli.theory:theory", "Diagonal-network theory: metrics, simulation, learning curves, advice."),
    "deep": ("ftlab.cli.deep:deep", "Init-scale interventions and geometry on deep networks."),
    "transfer": ("ftlab.cli.transfer:transfer", "Carry a task vector from one base model to another (BiCo)."),
    "reproduce": ("ftlab.cli.reproduce:reproduce", "Write the reproduction report (results/report.md)."),
    "explore": ("ftlab.cli.explore:explore", "A local page where regimes, l-order, PD and E_g(alpha) move with the knobs."),
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
    ftlab explore        the same theory on a local page, moving with its knobs
    ftlab deep ...       the same knobs (c, lambda, gamma) on real networks
    ftlab transfer ...   training-free task-vector transfer (BiCo, arXiv 2605.28444)
    ftlab reproduce      the reproduction report, quick by default (--full: larger runs,
                         still far below the papers' scale)

    Run `ftlab COMMAND --help` for each command's options.
    """
    global _VERBOSE
    _VERBOSE = verbose
    set_quiet(quiet)
    set_stage_lines(True)
    level = logging.WARNING if verbose == 0 else (logging.INFO if verbose == 1 else logging.DEBUG)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = exc.filename if exc.filename is not None else ""
        return f"{exc.strerror}: {where}" if where else exc.strerror
    if isinstance(exc, MemoryError):
        return f"out of memory{': ' + str(exc) if str(exc) else ''} (reduce the size of the run)"
    msg = str(exc).strip().splitlines()
    return msg[0] if msg else exc.__class__.__name__


#: The last words of every interrupt message (sweeps append each finished point to their store).
RESUME = "Finished points of sweeps are kept in their stores: run the same command again to resume where it stopped."

#: Exceptions that mean "the user's input or machine is at fault", not ftlab: exit 2, one line.
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError, MemoryError)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread so that every cleanup (staging folders, locks,
    worker processes) runs as for Ctrl-C."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _terminate(signum, _frame):
    raise Terminated(signum)


def interrupted_message(exc: BaseException | None) -> tuple[str, int]:
    """The one line printed after Ctrl-C / SIGTERM / SIGHUP, and the exit status (130 / 128 + signal).

    It says what happened to each output set of the run (finished, or discarded with the previous
    one unchanged), from :func:`ftlab.core.results.output_outcomes`; nothing about outputs when the
    run had not begun to write one.
    """
    while exc is not None and not isinstance(exc, KeyboardInterrupt):
        exc = exc.__cause__ or exc.__context__
    term = isinstance(exc, Terminated)
    results = sys.modules.get("ftlab.core.results")
    facts = results.output_outcomes() if results is not None else []
    text = f"ftlab: {'terminated' if term else 'interrupted'}."
    if facts:
        text += " " + "; ".join(facts) + "."
    return f"{text} {RESUME}", 128 + exc.signum if isinstance(exc, Terminated) else 130


def _user_code_line(exc: BaseException) -> str | None:
    """The one-line error for an exception raised in the user's own code, else ``None`` (see ftlab.core.usercode)."""
    from ftlab.core.usercode import culprit, describe

    kind, frame = culprit(exc)
    return f"in your code: {describe(exc, frame)}" if kind == "user" else None


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; user errors exit 2 with one line on stderr, bugs exit 1 (see the module docstring)."""
    import threading

    handlers = {s: signal.signal(s, _terminate) for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None))
                if s is not None and threading.current_thread() is threading.main_thread()}
    try:
        cli.main(args=argv, prog_name="ftlab", standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt) as exc:
        text, code = interrupted_message(exc)
        click.echo(text, err=True)
        sys.exit(code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except USER_ERRORS as exc:
        if os.environ.get("FTLAB_DEBUG"):
            raise
        click.echo(f"ftlab: error: {_one_line(exc)}", err=True)
        sys.exit(2)
    except Exception as exc:  # noqa: BLE001 - the user's code, or a bug: say which, never disguise a bug
        if os.environ.get("FTLAB_DEBUG") or _VERBOSE:
            traceback.print_exc()
        line = _user_code_line(exc)
        if line is not None:
            click.echo(f"ftlab: error: {line}", err=True)
            sys.exit(2)
        click.echo(f"ftlab: internal error: {type(exc).__name__}: {_one_line(exc)} -- this is a bug in ftlab, "
                   "please report it (run with -v for the traceback)", err=True)
        sys.exit(1)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


if __name__ == "__main__":  # pragma: no cover
    main()
