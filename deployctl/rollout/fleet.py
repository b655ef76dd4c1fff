"""The fleet of one service as the rollout sees it: a connected Host per configured host, the router, the shared
state store and the lock, plus the multi-host operations deploy, abort and rollback share."""
from __future__ import annotations

from collections import Counter
from typing import Callable, Optional

from deployctl.config import DeployConfig
from deployctl.errors import DeployctlError, ExitCode, RemoteError, about
from deployctl.rollout import hostops, release
from deployctl.service import launcher
from deployctl.rollout.lock import DeployLock, describe
from deployctl.rollout.router import Router, Split, router_host_config
from deployctl.rollout.state import StateStore


class Interrupted(DeployctlError):
    """Ctrl-C: the rollout stopped in a consistent state (exit 130)."""

    exit_code = ExitCode.INTERRUPTED


class Fleet:
    def __init__(self, cfg: DeployConfig, say):
        self.cfg, self.say = cfg, say
        self.hosts: dict = {}
        self.router: Optional[Router] = None
        self.store: Optional[StateStore] = None
        self._lock: Optional[DeployLock] = None
        self._router_host = None
        self.wheel = None

    # ------------------------------------------------------------------------------------------ connections
    def connect(self) -> None:
        from deployctl.hosts import Host

        self.hosts = {h.name: Host.from_config(h) for h in self.cfg.hosts}
        self.store = StateStore(list(self.hosts.values()))
        # which port each runtime serves on now (the configured one, or spare_port after a rollback there)
        hostops.on_hosts([h for h in self.hosts.values() if h.config.spare_port],
                         lambda h: launcher.load_port(h, self.cfg))
        if self.cfg.router is not None:
            self._router_host = Host.from_config(router_host_config(self.cfg))
            self.router = Router(self.cfg, self._router_host)

    def close(self) -> None:
        for h in [*self.hosts.values(), self._router_host]:
            if h is not None:
                try:
                    h.close()
                except Exception:
                    pass

    def current_releases(self) -> dict[str, Optional[str]]:
        """``current`` on every host. Raises the first RemoteError when a host cannot be reached (exit 4)."""
        ok, bad = hostops.on_hosts(list(self.hosts.values()), release.current_release)
        if bad:
            name, err = next(iter(bad.items()))
            raise err if isinstance(err, DeployctlError) else RemoteError(about(name, err))
        return {n: ok.get(n) for n in self.hosts}

    # ------------------------------------------------------------------------------------------ lock
    def lock(self, command: str, *, break_lock: bool = False, break_stale: bool = False,
             take_over: bool = False) -> None:
        self._lock = DeployLock(list(self.hosts.values()), command=command)

        def told(host, owner, why):
            self.say("warn", f"broke the lock on {host} held by {describe(owner)}: {why}")

        self._lock.acquire(break_lock=break_lock, break_stale=break_stale, take_over=take_over, on_break=told)

    def inspect_lock(self):
        return DeployLock(list(self.hosts.values()), command="inspect").inspect()

    def unlock(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # ------------------------------------------------------------------------------------------ release
    def preflight_gate(self) -> None:
        """Run preflight on every host; any failed check stops the deploy before anything changes (exit 1)."""
        from deployctl.rollout.gate import preflight_gate

        preflight_gate(self.cfg, self.say)
        self.warn_inconsistent()

    def warn_inconsistent(self) -> list[str]:
        """Warn (never fail) when the hosts already differ in release, engine, model manifest or config: the
        deploy will make them agree, but the operator should know what they were serving. Returns the lines."""
        from deployctl.rollout.fleetcheck import differences, snapshot

        ok, _ = hostops.on_hosts(list(self.hosts.values()), lambda h: snapshot(h, self.cfg))
        lines = differences([{"host": n, **ok[n]} for n in self.hosts if n in ok])
        for line in lines:
            self.say("warn", f"fleet already inconsistent: {line}")
        return lines

    def make_release(self):
        self.wheel = release.build_wheel()
        first = next(iter(self.hosts.values()))
        manifest = release.read_manifest(first, self.cfg)
        info = release.make_release_info(self.cfg, self.wheel, manifest)
        self.say("info", f"release {info.id}: runtime {info.runtime_wheel}, config {info.config_hash[:12]}, "
                         f"model manifest {info.model_manifest_hash[:12]}")
        return info

    def upload_all(self, info) -> None:
        from deployctl.render import render_release
        from deployctl.service.http import api_key

        key = api_key(self.cfg)

        def up(h):
            files = render_release(self.cfg, h.config, info.id, api_key=key)
            return release.upload(h, self.cfg, info, self.wheel, files)

        self.say("info", f"uploading release {info.id} to {len(self.hosts)} hosts")
        _, bad = hostops.on_hosts(list(self.hosts.values()), up)
        if bad:
            name, err = next(iter(bad.items()))
            raise err if isinstance(err, DeployctlError) else RemoteError(f"upload to {name} failed: {err}")

    def prune(self, plan) -> None:
        keep = self.cfg.rollout.keep_releases
        protect = {plan.release.id} | ({plan.from_release} if plan.from_release else set())
        ok, _ = hostops.on_hosts(list(self.hosts.values()), lambda h: release.prune(h, keep, protect))
        gone = sorted({r for v in ok.values() for r in v})
        if gone:
            self.say("info", f"pruned old releases: {', '.join(gone)}")

    # ------------------------------------------------------------------------------------------ restore
    def restore(self, plan, switched: set[str], route: Optional[Callable[[Split], None]]) -> list[str]:
        """Put the fleet back on ``plan.from_release``: traffic to hosts never switched, then each switched host
        back (switch, install, restart, verify) and into the upstream. Returns problems (never raises)."""
        problems: list[str] = []
        old = [n for n in self.hosts if n not in switched]
        if route and old:
            try:
                route(Split(tuple(old), (), 0))
            except Exception as e:
                problems.append(f"router: {e}")
        back = [self.hosts[n] for n in self.hosts if n in switched]
        if not back:
            return problems
        if plan.from_release:
            for h in back:
                self.say("host", f"{h.name}: back to {plan.from_release}", host=h.name)
            ok, bad = hostops.on_hosts(back, lambda h: hostops.activate(h, self.cfg, plan.from_release))
        else:
            ok, bad = hostops.on_hosts(back, lambda h: launcher.stop(h, self.cfg))
            ok = {}
        problems += [about(n, e) for n, e in bad.items()]
        serving = old + [n for n in self.hosts if n in ok]
        if route and serving and ok:
            try:
                route(Split(tuple(serving), (), 0))
            except Exception as e:
                problems.append(f"router: {e}")
        return problems


def majority(values) -> Optional[str]:
    c = Counter(v for v in values if v)
    return c.most_common(1)[0][0] if c else None
