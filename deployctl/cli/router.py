"""`deployctl router reload`: re-apply the router's current split, so that nginx reads a renewed certificate."""
from __future__ import annotations

from pathlib import Path

import typer

from deployctl.cli._app import app, err_console, escape, out_console, print_json
from deployctl.cli.params import CONFIG, JSON

router_app = typer.Typer(
    help="The nginx router: reload it (a renewed TLS certificate, changed router settings).", no_args_is_help=True,
    epilog="Example: deployctl router reload",
)
app.add_typer(router_app, name="router")


@router_app.command("reload", epilog="Example: deployctl router reload")
def reload(config: Path = CONFIG, as_json: bool = JSON,
           force: bool = typer.Option(False, "--force", help="Reload even when the certificate file expires within "
                                      "the warning window (an expired one is refused all the same).")) -> None:
    """Render the router conf for the split now applied, `nginx -t`, `nginx -s reload` (open streams finish), then
    check the certificate nginx serves (router.tls): the served leaf must be the file's. A certificate file that
    expires within the warning window (CERT_WARN_DAYS) is refused before the reload unless --force; an expired or
    not yet valid one always (nginx keeps serving what it has). Exit 1 when nginx -t fails (the old conf stays),
    the file is refused or a certificate check fails (with --force, not for the file's expiry window), 3 without a
    router: section, 4 when the router host cannot be reached."""
    from deployctl.config import load_config
    from deployctl.config.router import CERT_WARN_DAYS
    from deployctl.errors import CheckFailed
    from deployctl.hosts import Host
    from deployctl.rollout.router import Router, router_host_config

    cfg = load_config(config)
    with Host.from_config(router_host_config(cfg)) as host:
        if cfg.router.tls is not None and not force:
            from deployctl.preflight.certs import file_expiry_guard

            soon = file_expiry_guard(host, cfg, within_days=CERT_WARN_DAYS)
            if soon is not None:
                raise CheckFailed(f"refusing to reload nginx on {host.name}: {soon.message}; it keeps serving the "
                                  f"certificate it has", fix=f"{soon.fix}; or `deployctl router reload --force` to "
                                  f"serve it anyway (within {CERT_WARN_DAYS} days of expiry)")
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
        # --force served a certificate inside the window on purpose: its expiry is reported, not a failure
        bad = next((c for c in checks if c.status == "fail" and not (force and c.name == "tls_certificate")), None)
        if bad is not None:
            raise CheckFailed(f"router certificate: {bad.message}", fix=bad.fix)
        return
    if as_json:
        print_json(doc)
    err_console.print("router.tls is not set: nothing to check beyond nginx -t")
