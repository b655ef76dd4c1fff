"""The typer app, the consoles and the one place where errors become exit codes.

Every command module in this package registers its commands on ``app`` and wraps its body in
``@handle_errors``. Lower layers raise ``deployctl.errors.DeployctlError``; nothing else prints.
"""
from __future__ import annotations

import functools
import json
import os
import sys
from typing import Any, Callable

import typer
from rich.console import Console
from rich.markup import escape

from deployctl.errors import EXIT_INTERRUPTED, DeployctlError

app = typer.Typer(
    name="deployctl",
    help="Put an LLM inference service into production and take it back out.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

# Human output goes to stderr so that `--json` leaves stdout to one JSON document.
err_console = Console(stderr=True, highlight=False)
# Tables and reports a person reads (never used together with --json).
# Piped into a file or `less`, rich would assume 80 columns and cut release ids and timestamps in tables.
out_console = Console(highlight=False, width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 200)
_state = {"debug": False}


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors.")) -> None:
    _state["debug"] = debug


def is_debug() -> bool:
    return _state["debug"]


def print_json(document: Any) -> None:
    """Write one JSON document on stdout and nothing else."""
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def fail(err: DeployctlError) -> typer.Exit:
    """Print ``err`` as one line on stderr and return the typer.Exit carrying its code."""
    err_console.print(f"[bold red]error:[/] {escape(str(err))}", markup=True, soft_wrap=True)
    # The class attribute: host errors (deployctl.hosts) use the instance's .exit_code for the remote
    # command's exit status, as INTERFACES.md says; the process exit code is the class's.
    return typer.Exit(type(err).exit_code)


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn DeployctlError into its message and exit code, Ctrl-C into 130."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except DeployctlError as err:
            if _state["debug"]:
                err_console.print_exception()
            raise fail(err) from None
        except KeyboardInterrupt:
            err_console.print("interrupted")
            raise typer.Exit(EXIT_INTERRUPTED) from None

    return wrapper
