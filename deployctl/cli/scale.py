"""`deployctl scale out HOST…` and `deployctl scale in HOST… [--purge]` (deployctl.rollout.scale)."""
from __future__ import annotations

from pathlib import Path

import typer

from deployctl.cli._app import app, out_console, print_json
from deployctl.cli.params import CONFIG, JSON, seconds

scale_app = typer.Typer(help="Add hosts to the serving fleet or take them out, without losing a request.",
                        no_args_is_help=True, epilog="Example: deployctl scale out gpu-c")
app.add_typer(scale_app, name="scale")


def _say(message: str) -> None:
    out_console.print(message, markup=False, soft_wrap=True, highlight=False)


@scale_app.command("out", epilog="Example: deployctl scale out gpu-3 --slow-start 60")
def out(
    hosts: list[str] = typer.Argument(..., help="Host names from deploy.yaml (e.g. ones marked pool: warm)."),
    config: Path = CONFIG,
    slow_start: float = typer.Option(30.0, "--slow-start", parser=seconds("--slow-start", "30"),
                                     help="Seconds over which the router ramps the new hosts' weight up to an equal share."),
    warmup_requests: int = typer.Option(200, "--warmup-requests", min=1,
                                        help="At most this many warm-up requests per host before its weight ramps."),
    as_json: bool = JSON,
) -> None:
    """Put HOSTS into service: install the serving release (or wake a warm-pool engine), verify it (ready, sample
    inference, the release's golden answers), warm it up until its TTFT is near the fleet's, then ramp its router
    weight over --slow-start. Under the deploy lock; recorded in the history.
    """
    from deployctl.config import load_config
    from deployctl.rollout.scale import scale_out

    res = scale_out(load_config(config), hosts, say=(lambda m: None) if as_json else _say, slow_start_s=slow_start,
                    warmup={"max_requests": warmup_requests})
    if as_json:
        print_json(res.to_json())


@scale_app.command("in", epilog="Example: deployctl scale in gpu-3")
def in_(
    hosts: list[str] = typer.Argument(..., help="Serving host names from deploy.yaml."),
    config: Path = CONFIG,
    purge: bool = typer.Option(False, "--purge", help="Also remove the hosts' releases (kept for a rollback by default)."),
    as_json: bool = JSON,
) -> None:
    """Take HOSTS out of service: router weight 0, wait for their in-flight requests, leave the router, then stop
    the engine (a pool: warm host's sleeps instead, for the next scale out). Refused when no host would be left.
    """
    from deployctl.config import load_config
    from deployctl.rollout.scale import scale_in

    res = scale_in(load_config(config), hosts, purge=purge, say=(lambda m: None) if as_json else _say)
    if as_json:
        print_json(res.to_json())


@scale_app.command("warm", epilog="Example: deployctl scale warm gpu-3")
def warm(
    hosts: list[str] = typer.Argument(None, help="Warm-pool hosts (default: every pool: warm host not serving)."),
    config: Path = CONFIG,
) -> None:
    """Start the warm pool once and keep it asleep: install the serving release on each pool: warm host not
    serving, start it off the router, verify it (ready, sample inference, golden answers), put it to sleep, so that
    `scale out` is a wake.
    """
    from deployctl.config import load_config
    from deployctl.rollout.scale import prime

    prime(load_config(config), hosts or None, say=_say)
