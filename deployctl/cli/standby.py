"""`deployctl standby stop`: stop the previous release kept asleep on a host's other port (deployctl.rollout.standby_stop)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from deployctl.cli._app import app, out_console, print_json
from deployctl.cli.params import CONFIG, JSON

standby_app = typer.Typer(
    help="The previous release kept asleep on each host's other port (rollout.standby_s).", no_args_is_help=True,
    epilog="Example: deployctl standby stop --host gpu-a",
)
app.add_typer(standby_app, name="standby")


@standby_app.command("stop", epilog="Example: deployctl standby stop --host gpu-a --reason 'free the GPU'")
def stop(config: Path = CONFIG,
         host: Optional[List[str]] = typer.Option(None, "--host", help="Only this host (repeat for more; default: every host)."),
         reason: str = typer.Option("", "--reason", help="Why, for the history record."),
         as_json: bool = JSON) -> None:
    """Stop the standby (the previous release asleep on the host's other port) now, inside its window or not: its
    runtime and what is left of its engine stop, shared/run/standby.json goes, and a `standby-stop` record goes
    into `deployctl history`. A rollback after this restarts the previous release cold. Exit 0 (also when a host
    has no standby), 2 for an unknown --host, 1 while a deploy or rollback holds the lock, 4 when a host cannot be
    reached."""
    from deployctl.config import load_config
    from deployctl.cli.rollout import progress_printer
    from deployctl.rollout.standby_stop import stop_standbys

    done = stop_standbys(load_config(config), host or (), reason=reason, progress=progress_printer)
    if as_json:
        print_json({"hosts": [d.to_json() for d in done]})
        return
    for d in done:
        if d.release is None:
            out_console.print(f"{d.host}: no standby", markup=False)
        else:
            out_console.print(f"{d.host}: stopped the standby of {d.release} on port {d.port} in {d.seconds:.1f} s"
                              + (" (it had expired)" if d.expired else ""), markup=False)
