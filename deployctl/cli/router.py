"""`deployctl router reload`: re-apply the router's current split, so that nginx reads a renewed certificate."""
from __future__ import annotations

from pathlib import Path

import typer

from deployctl.cli._app import app, err_console, escape, out_console, print_json
from deployctl.cli.params import CONFIG, JSON

router_app = typer.Typer(help="The nginx router: reload it (a renewed TLS certificate, changed router settings).",
                         no_args_is_help=True)
app.add_typer(router_app, name="router")


@router_app.command("reload")
def reload(config: Path = CONFIG, as_json: bool = JSON) -> None:
    """Render the router conf for the split now applied, `nginx -t`, `nginx -s reload` (open streams finish), then
    check the certificate nginx serves (router.tls): the served leaf must be the file's. An expired or not yet valid
    certificate file is refused before the reload (nginx keeps serving what it has). Exit 1 when nginx -t fails
    (the old conf stays), the file is refused or a certificate check fails, 3 without a router: section, 4 when the
    router host cannot be reached."""
    from deployctl.config import load_config
    from deployctl.errors import CheckFailed
    from deployctl.hosts import Host
    from deployctl.rollout.router import Router, router_host_config

    cfg = load_config(config)
    with Host.from_config(router_host_config(cfg)) as host:
        split = Router(cfg, host).reload()
    doc = {"router": host.name, "split": split.to_json(), "checks": []}
    say = err_console if as_json else out_console
    say.print(f"nginx reloaded on {escape(host.name)}: canary {split.weight}% "
                      f"(stable {', '.join(split.stable) or '-'}; canary {', '.join(split.canary) or '-'})")
    if cfg.router.tls is not None:
        from deployctl.preflight.certs import router_certificate

        _, checks, facts = router_certificate(cfg, after_reload=True)
        doc["checks"], doc["facts"] = [c.to_json() for c in checks], facts
        for c in checks:
            color = {"pass": "green", "warn": "yellow", "fail": "red"}[c.status]
            say.print(f"[{color}]{c.status}[/] {c.name}: {escape(c.message)}"
                              + (f" — {escape(c.fix)}" if c.fix and c.status != "pass" else ""))
        if as_json:
            print_json(doc)
        bad = next((c for c in checks if c.status == "fail"), None)
        if bad is not None:
            raise CheckFailed(f"router certificate: {bad.message}", fix=bad.fix)
        return
    if as_json:
        print_json(doc)
    err_console.print("router.tls is not set: nothing to check beyond nginx -t")
