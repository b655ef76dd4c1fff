"""The fleet of one service as the rollout sees it: a connected Host per configured host, the router, the shared
state store and the lock, plus the multi-host operations deploy, abort and rollback share."""
from __future__ import annotations

from collections import Counter
from typing import Callable, Optional

from deployctl.config import DeployConfig
from deployctl.config.units import format_bytes
from deployctl.engines.command import stop_wait_s
from deployctl.errors import DeployctlError, ExitCode, RemoteError, about
from deployctl.rollout import hostops, release, standby
from deployctl.service import launcher
from deployctl.service.engine import Engine
from deployctl.rollout.lock import DeployLock, describe
from deployctl.rollout.router import Router, Split, router_host_config
from deployctl.rollout.servedname import as_release
from deployctl.rollout.state import StateStore


class Interrupted(DeployctlError):
    """Ctrl-C: the rollout stopped in a consistent state (exit 130)."""

    exit_code = ExitCode.INTERRUPTED


class Fleet:
    def __init__(self, cfg: DeployConfig, say):
        self.cfg, self.say = cfg, say
        self.hosts: dict = {}
        self.model_fetch: Optional[str] = None  # fetch_model's one-line summary, for the deploy's history record
        self.router: Optional[Router] = None
        self.platform: dict = {}  # host name -> preflight.platform_of(facts), from the gate (empty when skipped)
        # host name -> the probe's ``nvidia`` facts from the gate (empty when skipped): release.json's gpu_pinning
        self.gpu_facts: dict = {}
        self.store: Optional[StateStore] = None
        self._lock: Optional[DeployLock] = None
        self.fence = None  # deployctl.hosts.fence.Fence of the lock this fleet took (kept after unlock)
        self._router_host = None
        self.wheel = None

    @property
    def workers(self) -> int:
        """Hosts worked on at once by every fleet-wide operation (rollout.parallel_hosts): host steps, the state
        store, the lock (analysis scrapes read the same setting)."""
        return self.cfg.rollout.parallel_hosts

    def on_hosts(self, hosts: list, fn, **kw) -> tuple[dict, dict]:
        """hostops.on_hosts with this fleet's bound: at most rollout.parallel_hosts hosts worked at once."""
        return hostops.on_hosts(hosts, fn, workers=self.workers, **kw)

    # ------------------------------------------------------------------------------------------ connections
    def connect(self) -> None:
        from deployctl.hosts import Host

        self.hosts = {h.name: Host.from_config(h) for h in self.cfg.hosts}
        self.store = StateStore(list(self.hosts.values()), workers=self.workers)
        # which port each runtime serves on now (the configured one, or spare_port after a rollback there)
        self.on_hosts([h for h in self.hosts.values() if h.config.spare_port],
                         lambda h: launcher.load_port(h, self.cfg), deadline_s=hostops.QUICK_DEADLINE_S,
                         what="reading the active port")
        if self.cfg.router is not None:
            self._router_host = Host.from_config(router_host_config(self.cfg))
            self.router = Router(self.cfg, self._router_host)

    def leave_out(self) -> None:
        """Keep only the serving, uncordoned hosts (deployctl.rollout.members.leave_out: each one left out is said):
        ``cfg``, ``hosts`` and the state store then name those only (the others' connections closed). Raises
        CheckFailed when none is left."""
        from deployctl.rollout.members import leave_out

        cfg = leave_out(self.cfg, self.say, store=self.store)
        if cfg is self.cfg:
            return
        gone = [h for n, h in self.hosts.items() if n not in {c.name for c in cfg.hosts}]
        self.cfg = cfg
        self.hosts = {n: h for n, h in self.hosts.items() if n not in {g.name for g in gone}}
        self.store = StateStore(list(self.hosts.values()), workers=self.workers)
        if self.router is not None:
            self.router.cfg = cfg
        _close_in_background(gone)

    def reconnect(self) -> None:
        """Fresh connections to every host and the router, for the abort (issue 31): a connection that was in use
        when a failure or Ctrl-C came may be broken or still busy in an abandoned worker. The state store, the
        router and the lock move to the new Host objects (with their fence); the old ones are closed in the
        background."""
        old = [*self.hosts.values(), self._router_host]
        self.hosts = {n: _fresh(h) for n, h in self.hosts.items()}
        self.store = StateStore(list(self.hosts.values()), workers=self.workers)
        if self._router_host is not None:
            self._router_host = _fresh(self._router_host)
            self.router.host = self._router_host
        if self._lock is not None:
            self._lock.hosts = [self.hosts[h.name] for h in self._lock.hosts]
            self._lock.held = [self.hosts[h.name] for h in self._lock.held]
            self._lock.extra = [self._router_host] if self._lock.extra else []
        _close_in_background(old)

    def close(self) -> None:
        """Close every connection, bounded (a close that hangs on a dead peer is left behind)."""
        from deployctl.hosts import run_on_hosts

        run_on_hosts([h for h in [*self.hosts.values(), self._router_host] if h is not None], _quiet_close,
                     deadline_s=10, what="closing the connection")

    def current_releases(self) -> dict[str, Optional[str]]:
        """``current`` on every host. Raises the first RemoteError when a host cannot be reached (exit 4)."""
        ok, bad = self.on_hosts(list(self.hosts.values()), release.current_release,
                                   deadline_s=hostops.QUICK_DEADLINE_S, what="reading the current release")
        if bad:
            name, err = next(iter(bad.items()))
            raise err if isinstance(err, DeployctlError) else RemoteError(about(name, err))
        return {n: ok.get(n) for n in self.hosts}

    # ------------------------------------------------------------------------------------------ lock
    def lock(self, command: str, *, break_lock: bool = False, break_stale: bool = False,
             take_over: bool = False, runner=None) -> None:
        """Take the deploy lock (deployctl.rollout.lock.DeployLock.acquire) over the hosts, the router host fenced
        with its generation too; this machine's journal of the service is fenced with it as well
        (deployctl.rollout.journal.raise_fence). A lock taken over from another holder is said and recorded in the
        history (action ``takeover``: ``by`` this command, ``from`` the holder, ``reason`` why). Raises LockHeld."""
        from deployctl.rollout.journal import raise_fence, read_fence

        extra = (self._router_host,) if self._router_host is not None else ()
        self._lock = DeployLock(list(self.hosts.values()), command=command, runner=runner, workers=self.workers,
                                extra=extra, floor=read_fence(self.cfg.service.name)[0])
        broken: dict[str, tuple[dict, str, list[str]]] = {}

        def told(host, owner, why):
            self.say("warn", f"broke the lock on {host} held by {describe(owner)}: {why}")
            key = str(owner.get("token") or describe(owner))
            broken.setdefault(key, (owner, why, []))[2].append(host)

        self._lock.acquire(break_lock=break_lock, break_stale=break_stale, take_over=take_over, on_break=told)
        self.fence = self._lock.fence
        raise_fence(self.cfg.service.name, self._lock.generation, self._lock.who())
        for owner, why, hosts in broken.values():
            self.store.append_history("takeover", release=None, result="ok", by=command,
                                      generation=self._lock.generation,
                                      reason=f"{command} took over the lock on {', '.join(hosts)} from "
                                             f"{describe(owner)}: {why}",
                                      **{"from": {k: owner.get(k) for k in ("owner", "machine", "pid", "command",
                                                                            "unit", "generation") if k in owner}})

    @property
    def generation(self) -> int:
        """The generation of the lock this fleet took (0: none)."""
        return self.fence.generation if self.fence is not None else 0

    def inspect_lock(self):
        return DeployLock(list(self.hosts.values()), command="inspect", workers=self.workers).inspect()

    def unlock(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # ------------------------------------------------------------------------------------------ release
    def preflight_gate(self) -> None:
        """Run preflight on every host; any failed check stops the deploy before anything changes (exit 1)."""
        from deployctl.preflight import platform_of
        from deployctl.rollout.gate import preflight_gate

        report = preflight_gate(self.cfg, self.say)
        self.platform = {h.host: platform_of(h.facts) for h in report.hosts if not h.facts.get("error")}
        self.gpu_facts = {h.host: h.facts.get("nvidia") for h in report.hosts
                          if not h.facts.get("error") and h.facts.get("nvidia") is not None}
        self.warn_inconsistent()

    def warn_inconsistent(self) -> list[str]:
        """Warn (never fail) when the hosts already differ in release, engine, model manifest or config: the
        deploy will make them agree, but the operator should know what they were serving. Returns the lines."""
        from deployctl.rollout.fleetcheck import differences, snapshot

        ok, _ = self.on_hosts(list(self.hosts.values()), lambda h: snapshot(h, self.cfg),
                                 deadline_s=hostops.QUICK_DEADLINE_S, what="reading what each host serves")
        lines = differences([{"host": n, **ok[n]} for n in self.hosts if n in ok])
        for line in lines:
            self.say("warn", f"fleet already inconsistent: {line}")
        return lines

    def fetch_model(self) -> None:
        """With model.source: every host fetches model.version into its store (deployctl.weights), before the
        preflight gate checks it and before anything else changes; the versions kept releases use are never pruned
        to make room. Raises WeightsFetchFailed naming each failed host (the stable release keeps serving)."""
        from deployctl.weights.fetch import fetch_to_hosts
        from deployctl.weights.inuse import release_model_versions
        from deployctl.weights.sources import plan as make_plan

        plan = make_plan(self.cfg.model)
        kept, _ = self.on_hosts(list(self.hosts.values()), release_model_versions,
                                deadline_s=hostops.QUICK_DEADLINE_S, what="reading the kept releases' model versions")
        in_use = tuple(sorted({v for per in kept.values() for v in per.values() if v}))
        self.say("info", f"fetching model {plan.version} from {plan.source} ({plan.total_bytes} bytes, "
                         f"{len(plan.files)} files) onto {len(self.hosts)} hosts, "
                         f"{self.cfg.model.fetch_parallel_hosts} at a time")
        done = fetch_to_hosts(list(self.hosts.values()), self.cfg.model, plan, kept_versions=in_use)
        fetched = sum(d.bytes_fetched for d in done)
        self.model_fetch = (f"model {plan.version}: on {len(done)} hosts, verified; {fetched} bytes fetched in "
                            f"{max(d.seconds for d in done):.1f} s ({sum(d.already for d in done)} hosts had it), "
                            f"manifest {plan.manifest_sha256[:12]}")
        self.say("info", self.model_fetch)

    def make_release(self):
        self.wheel = release.build_wheel()
        first = next(iter(self.hosts.values()))
        manifest = release.read_manifest(first, self.cfg)
        info = release.make_release_info(self.cfg, self.wheel, manifest,
                                         model_files=release.read_model_files(first, self.cfg))
        self.say("info", f"release {info.id}: runtime {info.runtime_wheel}, config {info.config_hash[:12]}, "
                         f"model manifest {info.model_manifest_hash[:12]}")
        return info

    def files_for(self, info) -> Callable:
        """``files(host)``: the rendered release files of ``info`` for a host, as upload_all sends them."""
        from deployctl import settings
        from deployctl.render import render_release
        from deployctl.render.targets import api_key_from_env
        from deployctl.service.http import api_key

        key = api_key(self.cfg)  # unset: no key (preflight's api_key check said what that means)
        if key and self.cfg.server.next_api_key_env:  # a rotation: both keys in runtime.env
            key = api_key_from_env(self.cfg, settings.environ())
        return lambda h: render_release(self.cfg, h.config, info.id, api_key=key,
                                        gpu_pinning=self.gpu_pinning(h.config))

    def check_disk(self, info, hosts: Optional[list] = None) -> None:
        """Before any upload: does ``info`` fit on every host, or those of ``hosts`` (deployctl.rollout.diskcheck).
        Raises DiskShort (nothing changed)."""
        from deployctl.rollout import diskcheck

        diskcheck.check(self, info, self.files_for(info), hosts)

    def upload_all(self, info, point=None, hosts: Optional[list] = None) -> None:
        """Upload ``info`` to every host (or those of ``hosts``) at once (release.upload). ``point(what, host=...)``, when given, is told
        inside each host's upload (the rollout journal's points): after its files are rendered and after the tar
        file is on the host, before it is unpacked. Leftovers of interrupted uploads that the uploads removed are
        said and recorded in the history (action ``cleanup``). Raises the first host's error."""
        files_for = self.files_for(info)
        removed: dict = {}

        def up(h):
            files = files_for(h)
            if point:
                point("upload:rendered", host=h.name)
            return release.upload(h, self.cfg, info, self.wheel, files, platform=self.platform.get(h.name),
                                  on_put=(lambda: point("upload:put", host=h.name)) if point else None,
                                  removed=removed.setdefault(h.name, []))

        hosts = list(self.hosts.values()) if hosts is None else hosts
        self.say("info", f"uploading release {info.id} to {len(hosts)} hosts")
        _, bad = self.on_hosts(hosts, up, deadline_s=release.UPLOAD_DEADLINE_S,
                                  what=f"uploading release {info.id}")
        removed = {n: gone for n, gone in removed.items() if gone}
        for n, gone in removed.items():
            self.say("info", f"{n}: removed leftovers of interrupted uploads: "
                             + ", ".join(f"{g['name']} ({format_bytes(g['bytes'])})" for g in gone), host=n)
        if removed:
            self.store.append_history("cleanup", release=info.id, result="ok", removed=removed,
                                      reason="leftovers of interrupted uploads, removed before the upload")
        if bad:
            name, err = next(iter(bad.items()))
            raise err if isinstance(err, DeployctlError) else RemoteError(f"upload to {name} failed: {err}")

    def gpu_pinning(self, host_cfg):
        """The release's GPU record for ``host_cfg`` (deployctl.render.gpupin.pinning): by UUID from the gate's
        facts; by index, saying why, when the gate did not run (DEPLOYCTL_SKIP_PREFLIGHT, a resumed deploy)."""
        from deployctl.render.gpupin import pinning

        nvidia = self.gpu_facts.get(host_cfg.name)
        why = ("preflight was skipped (DEPLOYCTL_SKIP_PREFLIGHT or a resumed deploy): no GPU facts, pinned by index"
               if not self.gpu_facts else f"preflight gave no GPU facts for {host_cfg.name}: pinned by index")
        return pinning(self.cfg, host_cfg, nvidia, why=why)

    def prune(self, plan) -> None:
        keep = self.cfg.rollout.keep_releases
        protect = {plan.release.id} | ({plan.from_release} if plan.from_release else set())
        ok, _ = self.on_hosts(list(self.hosts.values()), lambda h: release.prune(h, keep, protect),
                                 deadline_s=hostops.QUICK_DEADLINE_S, what="pruning old releases")
        gone = sorted({r for v in ok.values() for r in v})
        if gone:
            self.say("info", f"pruned old releases: {', '.join(gone)}")
        if self.cfg.model.source:
            self.prune_models()

    def prune_models(self) -> None:
        """After the release prune: each host deletes the model versions no kept release uses beyond
        model.keep_versions (deployctl.weights.keep.versions_to_prune, the one rule)."""
        from deployctl.weights.fetch import list_versions, prune_versions
        from deployctl.weights.inuse import release_model_versions
        from deployctl.weights.keep import versions_to_prune

        model = self.cfg.model

        def one(h) -> list:
            in_use = tuple(v for v in release_model_versions(h).values() if v)
            return prune_versions(h, model, versions_to_prune(list_versions(h, model), model.version, in_use,
                                                              model.keep_versions))

        ok, _ = self.on_hosts(list(self.hosts.values()), one, deadline_s=hostops.QUICK_DEADLINE_S,
                              what="pruning old model versions")
        gone = sorted({v for per in ok.values() for v in per})
        if gone:
            self.say("info", f"pruned model versions no kept release uses: {', '.join(gone)}")

    # ------------------------------------------------------------------------------------------ restore
    def restore(self, plan, switched: set[str], route: Optional[Callable[[Split], None]]) -> list[str]:
        """Put the fleet back on ``plan.from_release``: traffic to hosts never switched, then each switched host
        back (switch, install, restart, verify) and into the upstream. Returns problems (never raises)."""
        problems: list[str] = []
        current = getattr(plan, "current", None) or {}
        # a host that had no release before this deploy (a host new in deploy.yaml) gets no traffic back
        old = [n for n in self.hosts if n not in switched
               and not (plan.from_release and n in current and not current[n])]
        if route and old:
            try:
                route(Split(tuple(old), (), 0))
            except Exception as e:
                problems.append(f"router: {e}")
        back = [self.hosts[n] for n in self.hosts if n in switched]
        if not back:
            return problems
        # a host that had no release before this deploy (first deploy, or a host new in deploy.yaml) is stopped
        bare = [h for h in back if not plan.from_release or (h.name in current and not current[h.name])]
        back = [h for h in back if h not in bare]
        ok, bad = {}, {}
        if back:
            for h in back:
                self.say("host", f"{h.name}: back to {plan.from_release}", host=h.name)
            # a canary whose old release sleeps beside it: stop the canary, wake the old one (standby.restore)
            # each release verified under its own served name (a new model.served_name must not make the old
            # release look broken: deployctl.rollout.servedname)
            ok, bad = self.on_hosts(back, lambda h: standby.restore(h, as_release(self.cfg, h, plan.from_release),
                                                                    plan.from_release, say=self.say),
                                       deadline_s=hostops.activate_deadline_s(self.cfg),
                                       what=f"going back to {plan.from_release}")
        if bare:
            for h in bare:
                self.say("host", f"{h.name}: had no release before: stopping it", host=h.name)

            def stop_bare(h):
                Engine(h, self.cfg).stop()
                if plan.from_release:  # a new host beside serving ones: it serves nothing again, and says so
                    release.clear_current(h)

            _, stopped_bad = self.on_hosts(bare, stop_bare,
                                              deadline_s=stop_wait_s(self.cfg) + 60,
                                              what="stopping the runtime")
            bad.update(stopped_bad)
        problems += [about(n, e) for n, e in bad.items()]
        serving = old + [n for n in self.hosts if n in ok]
        if route and serving and ok:
            try:
                route(Split(tuple(serving), (), 0))
            except Exception as e:
                problems.append(f"router: {e}")
        return problems


def _fresh(host):
    """A new connection to ``host``'s machine carrying the same fence (deployctl.hosts.fence)."""
    from deployctl.hosts import Host

    h = Host.from_config(host.config)
    h.fence = host.fence
    return h


def _quiet_close(host) -> None:
    try:
        host.close()
    except Exception:  # noqa: BLE001 - closing a dead connection must not mask what the caller reports
        pass


def _close_in_background(hosts: list) -> None:
    import threading

    def close_all():
        for h in hosts:
            if h is not None:
                _quiet_close(h)

    threading.Thread(target=close_all, name="deployctl-close-old", daemon=True).start()


def majority(values) -> Optional[str]:
    c = Counter(v for v in values if v)
    return c.most_common(1)[0][0] if c else None
