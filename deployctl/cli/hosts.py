"""`deployctl hosts trust NAME` and `deployctl hosts check [NAME]`."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from deployctl.cli._app import app, err_console, out_console, print_json
from deployctl.cli.params import CONFIG, JSON, seconds

hosts_app = typer.Typer(
    help="SSH hosts: trust host keys, check that every host answers.", no_args_is_help=True,
    epilog="Example: deployctl hosts check",
)
app.add_typer(hosts_app, name="hosts")



def _select(config: Path, name: Optional[str]):
    from deployctl.config import load_config
    from deployctl.errors import UsageError

    cfg = load_config(config)
    if name is None:
        return list(cfg.hosts)
    for host in cfg.hosts:
        if host.name == name:
            return [host]
    names = ", ".join(h.name for h in cfg.hosts)
    raise UsageError(f"host {name!r} is not in {config}", fix=f"use one of: {names}")


@hosts_app.command("trust", epilog="Example: deployctl hosts trust gpu-a")
def trust(
    name: str = typer.Argument(..., help="Host name from deploy.yaml."),
    config: Path = CONFIG,
    yes: bool = typer.Option(False, "--yes", "-y", help="Record the key without asking (scripts)."),
    replace: bool = typer.Option(False, "--replace", help="Replace a changed key (host reinstalled)."),
) -> None:
    """Show the SHA256 fingerprint NAME offers and record it in deployctl's known_hosts on confirmation."""
    from deployctl.errors import CheckFailed, UsageError
    from deployctl.hosts.known_hosts import known_hosts_path, lookup, record_host_key
    from deployctl.hosts.keyprobe import probe_host_key
    from deployctl.hosts import HostKeyChanged

    (host,) = _select(config, name)
    if host.is_local:
        raise UsageError(f"host {name} has address: local", fix="local hosts are not reached over SSH")
    probe = probe_host_key(host)
    where = f"{name} ({probe.known_hosts_name})"
    if probe.status == "trusted":
        err_console.print(f"{where} is already trusted: {probe.key_type} {probe.fingerprint}")
        return
    if probe.status == "changed" and not replace:
        raise HostKeyChanged(
            f"host key changed for {name} ({probe.known_hosts_name}): offered {probe.fingerprint}, "
            f"known_hosts has {probe.expected_fingerprint}", host=name, fingerprint=probe.fingerprint,
            expected=probe.expected_fingerprint or "",
            fix=f"if {name} was reinstalled, verify the new key out of band and rerun with --replace")
    out_console.print(f"{where} offers {probe.key_type} {probe.fingerprint}", markup=False, soft_wrap=True)
    if probe.status == "changed":
        out_console.print(f"  replacing {probe.expected_fingerprint}", markup=False)
    if not yes and not typer.confirm("Trust this key?", default=False, err=True):
        raise CheckFailed(f"did not trust the host key of {name}", fix="rerun and answer y, or pass --yes")
    path = record_host_key(probe.hostname, probe.port, probe.key, replace=replace)
    err_console.print(f"recorded {probe.fingerprint} for {probe.known_hosts_name} in {path}", soft_wrap=True)
    stale = [k for k in lookup(probe.hostname, probe.port).values() if k.asbytes() != probe.key.asbytes()]
    if stale:
        err_console.print(f"warning: another known_hosts file still holds an old key for "
                          f"{probe.known_hosts_name}; remove it with `ssh-keygen -R '{probe.known_hosts_name}'`"
                          f" (deployctl's file: {known_hosts_path()})", soft_wrap=True)


@hosts_app.command("check", epilog="Example: deployctl hosts check -c deploy.yaml")
def check(
    name: Optional[str] = typer.Argument(None, help="Only this host (default: every host)."),
    config: Path = CONFIG,
    timeout: float = typer.Option(20.0, "--timeout", parser=seconds("--timeout"), help="Seconds per host for `true` to come back."),
    as_json: bool = JSON,
) -> None:
    """Run `true` on each host in parallel and report every host's outcome. Exit 4 if any failed."""
    from deployctl.errors import RemoteError
    from deployctl.hosts import Host, run_on_hosts

    hosts = [Host.from_config(h) for h in _select(config, name)]

    def probe(host: Host) -> float:
        try:
            return host.run(["true"], timeout=timeout).duration_s
        finally:
            host.close()

    outcomes = run_on_hosts(hosts, probe)
    failed = [o for o in outcomes if o.error is not None]
    retries = {h.name: h.connect_retries for h in hosts}  # handshakes sshd dropped (MaxStartups) and tried again
    if as_json:
        print_json({"ok": not failed, "connect_retries": sum(retries.values()), "hosts": [
            {"host": o.host, "ok": o.error is None, "duration_s": o.value, "connect_retries": retries[o.host],
             "error": str(o.error) if o.error else None,
             "error_type": type(o.error).__name__ if o.error else None} for o in outcomes]})
    else:
        width = max(len(o.host) for o in outcomes)
        for o in outcomes:
            again = f" ({retries[o.host]} dropped handshakes retried)" if retries[o.host] else ""
            line = (f"{o.host:<{width}}  ok  {o.value:.2f} s{again}" if o.error is None
                    else f"{o.host:<{width}}  FAIL  {o.error}")
            out_console.print(line, markup=False, soft_wrap=True, highlight=False)
    if failed:
        raise RemoteError(f"{len(failed)} of {len(outcomes)} hosts failed the check: "
                          + ", ".join(o.host for o in failed))


@hosts_app.command("cordon", epilog='Example: deployctl hosts cordon gpu-2 --reason "ECC errors on GPU 0" --stop')
def cordon_cmd(
    name: str = typer.Argument(..., help="Host name from deploy.yaml."),
    config: Path = CONFIG,
    reason: str = typer.Option("", "--reason", help="Why (shown by `status`, kept in the history)."),
    stop: bool = typer.Option(False, "--stop", help="Stop the engine once drained (default: keep it for debugging)."),
) -> None:
    """Take NAME out of the router (weight 0), wait for its in-flight requests (up to server.drain_timeout_s) and
    say how many were cut; keep its engine unless --stop. deploy and rollback leave it out until `uncordon`.
    """
    from deployctl.config import load_config
    from deployctl.rollout.cordon import cordon

    cordon(load_config(config), name, reason=reason, stop=stop, say=_say)


@hosts_app.command("uncordon", epilog="Example: deployctl hosts uncordon gpu-2")
def uncordon_cmd(
    name: str = typer.Argument(..., help="Host name from deploy.yaml."),
    config: Path = CONFIG,
) -> None:
    """Verify NAME (start its engine if stopped; ready, a sample inference, the release's golden answers), then give
    it its router weight back. Exit 5, still cordoned, when the answers differ.
    """
    from deployctl.config import load_config
    from deployctl.rollout.cordon import uncordon

    uncordon(load_config(config), name, say=_say)


def _say(message: str) -> None:
    out_console.print(message, markup=False, soft_wrap=True, highlight=False)
