"""`deployctl autoscale`: scale the serving fleet out or in from the engines' metrics (deployctl.rollout.autoscale_run)."""
from __future__ import annotations

import time
from pathlib import Path

import typer

from deployctl.cli._app import app, out_console, print_json
from deployctl.cli.params import CONFIG, JSON


@app.command("autoscale", epilog="Example: deployctl autoscale --once --dry-run -c deploy.yaml")
def autoscale(config: Path = CONFIG,
              once: bool = typer.Option(False, "--once", help="One window and one decision, then exit (the systemd "
                                                              "timer's form); default: one decision per window, "
                                                              "until interrupted."),
              dry_run: bool = typer.Option(False, "--dry-run", help="Decide and record the decision in history, "
                                                                    "but scale nothing."),
              as_json: bool = JSON) -> None:
    """Read the serving engines' waiting requests, KV cache usage and P99 TTFT over autoscale.window_s, and scale
    out onto a warm-pool host (hosts[].pool: warm) or in (drain the last serving host) within autoscale.min_hosts
    and max_hosts, with the hysteresis band and cooldown of deploy.yaml's autoscale: section. Every decision and
    its numbers go to `deployctl history` (action autoscale). Exit 0 whatever the decision, 4 when no engine's
    metrics can be read, 3 for a bad deploy.yaml.
    """
    from deployctl.cli.rollout import progress_printer
    from deployctl.config import load_config
    from deployctl.rollout.autoscale_run import autoscale_once
    from deployctl.rollout.events import emitter

    cfg = load_config(config)
    say = emitter(progress_printer)
    while True:
        d = autoscale_once(cfg, dry_run=dry_run, say=say)
        if as_json:
            print_json({**d.to_json(), "dry_run": dry_run})
        else:
            verb = {"out": "scale out", "in": "scale in", "none": "nothing"}[d.action]
            out_console.print(f"autoscale: {verb}{' (dry run)' if dry_run and d.action != 'none' else ''}: "
                              f"{d.reason}", markup=False)
        if once:
            return
        time.sleep(1)
