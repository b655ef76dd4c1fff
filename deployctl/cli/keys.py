"""`deployctl keys add|retire|list`: the API keys the router accepts (deployctl.rollout.keys), rotated with a router
reload and no engine restart."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from deployctl.cli._app import app, err_console, escape, out_console, print_json
from deployctl.cli.params import CONFIG, JSON

keys_app = typer.Typer(
    help="The API keys the router accepts: add one, retire one, list them with their last use.", no_args_is_help=True,
    epilog="Example: deployctl keys list",
)
app.add_typer(keys_app, name="keys")


def _router(config: Path):
    from deployctl.config import load_config
    from deployctl.hosts import Host
    from deployctl.rollout.router import router_host_config

    cfg = load_config(config)
    return cfg, Host.from_config(router_host_config(cfg))


@keys_app.command("add", epilog="Example: deployctl keys add --from-env NEW_API_KEY")
def add(from_env: Optional[str] = typer.Option(None, "--from-env", metavar="VAR",
                                               help="Read the key from this environment variable (default: "
                                                    "generate one and print it once)."),
        config: Path = CONFIG, as_json: bool = JSON) -> None:
    """Accept a new key beside the others (both work), then reload nginx: open streams finish, no engine restarts.
    Exit 2 when the key is accepted already or VAR is unset, 3 for a malformed key, 1 when nginx -t fails (the old
    keys stay)."""
    import secrets

    from deployctl import settings
    from deployctl.errors import UsageError
    from deployctl.rollout import keys

    if from_env is not None:
        key = settings.environ().get(from_env)
        if not key:
            raise UsageError(f"--from-env {from_env}: {from_env} is not set", fix=f"export {from_env}=<key>")
        what = f"${from_env}"
    else:
        key, what = secrets.token_urlsafe(32), "the generated key"
    cfg, host = _router(config)
    from deployctl.rollout.router import Router

    with host:
        entry = keys.add(Router(cfg, host), key, what)
    if as_json:
        print_json({"id": entry.id, "added": entry.added, **({"key": key} if from_env is None else {})})
        return
    if from_env is None:
        out_console.print(key, markup=False, highlight=False)
        err_console.print("the key above is shown once: give it to the clients; it is kept only in the router's 0600 "
                          "keys file")
    err_console.print(f"key {entry.id} accepted on {escape(host.name)} (nginx reloaded; the other keys still work)")


@keys_app.command("retire", epilog="Example: deployctl keys retire 3f2a")
def retire(ids: List[str] = typer.Argument(..., metavar="ID...", help="Key ids (or unique prefixes), from keys list."),
           config: Path = CONFIG, as_json: bool = JSON) -> None:
    """Stop accepting keys once their clients moved (keys list: last use), then reload nginx; requests with them get
    401 invalid_api_key. Exit 2 for an unknown or ambiguous id or when no key would be left."""
    from deployctl.rollout import keys

    cfg, host = _router(config)
    from deployctl.rollout.router import Router

    with host:
        gone = keys.retire(Router(cfg, host), ids)
    if as_json:
        print_json({"retired": gone})
        return
    err_console.print(f"retired {', '.join(gone)} on {escape(host.name)} (nginx reloaded)")


@keys_app.command("list", epilog="Example: deployctl keys list --json")
def list_(config: Path = CONFIG, as_json: bool = JSON) -> None:
    """Every key the router accepts and every retired one: id (SHA-256 prefix, as the access log's key_id), where
    it came from, when it was added or retired, and its last request and request count in the access log."""
    from deployctl.rollout import keys

    cfg, host = _router(config)
    with host:
        rows = keys.usage(host, cfg)
    if as_json:
        print_json({"router": host.name, "keys": [r.to_json() for r in rows]})
        return
    from rich.table import Table

    t = Table(title=f"API keys on the router {host.name}", title_justify="left")
    for col in ("id", "state", "source", "added / retired", "last used", "requests"):
        t.add_column(col)
    for r in rows:
        when = r.added if r.state == "accepted" else f"retired {r.retired_at}"
        t.add_row(r.id + (" (engine key)" if r.engine_key else ""), r.state, r.source or "-", when or "-",
                  r.last_used or "never", str(r.requests))
    out_console.print(t)
