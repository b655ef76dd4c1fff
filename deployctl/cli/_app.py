"""The typer app, the consoles and the one place where errors become exit codes.

Every command module in this package registers its commands on ``app``. Lower layers raise
``deployctl.errors.DeployctlError``; nothing else prints. ``_Group.invoke`` (the app's root group, run by
``deployctl.cli.main()``, ``python -m deployctl`` and in-process test runners alike) turns a DeployctlError into
its one-line message and ``ExitCode``, and Ctrl-C into 130: commands declare no error handling of their own.
"""
from __future__ import annotations

import json
import sys
from typing import Any

import click
import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from deployctl import settings
from deployctl.errors import DeployctlError, ExitCode


class _Group(TyperGroup):
    """The root command group; its ``invoke`` is the error boundary of every command."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except DeployctlError as err:
            if _state["debug"]:
                err_console.print_exception()
            raise fail(err) from None
        except KeyboardInterrupt:
            err_console.print("interrupted")
            raise typer.Exit(ExitCode.INTERRUPTED) from None


app = typer.Typer(
    cls=_Group,
    name="deployctl",
    help="Put an LLM inference service into production and take it back out.",
    epilog="Example: deployctl plan --gpu-memory 80GiB",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

# Human output goes to stderr so that `--json` leaves stdout to one JSON document.
err_console = Console(stderr=True, highlight=False)
# Tables and reports a person reads (never used together with --json).
# Piped into a file or `less`, rich would assume 80 columns and cut release ids and timestamps in tables.
out_console = Console(highlight=False, width=None if sys.stdout.isatty() or settings.columns_set() else 200)
_state = {"debug": False}


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors.")) -> None:
    _state["debug"] = debug
    settings.current()  # a bad DEPLOYCTL_* value: one line naming it, exit 2, before the command starts


def is_debug() -> bool:
    return _state["debug"]


def print_json(document: Any) -> None:
    """Write one JSON document on stdout and nothing else."""
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def fail(err: DeployctlError) -> typer.Exit:
    """Print ``err`` as one line on stderr and return the typer.Exit carrying its code."""
    err_console.print(f"[bold red]error:[/] {escape(str(err))}", markup=True, soft_wrap=True)
    return typer.Exit(err.exit_code)
