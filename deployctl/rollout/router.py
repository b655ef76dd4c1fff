"""The router: nginx on ``router.host``. ``Router.apply`` renders the upstream conf for the given split
(deployctl.render.render_nginx), writes it, runs ``nginx -t`` and reloads (``nginx -s reload``; never a restart).
If ``nginx -t`` fails the previous conf is put back and CheckFailed raised with nginx's message. ``Router.reload``
re-applies the last split (how a renewed TLS certificate is picked up; every deploy step applies one too).
Beside the conf, ``<upstream_conf>.state.json`` records the split (stable, canary, weight, drained, shares)
for ``deployctl status``.

Traffic shares (percent per host): each canary host gets weight/len(canary), each stable host
(100 - weight)/len(stable); drained hosts 0. The rendered nginx weights are these shares scaled to integers
(canary: pct × n_stable, stable: (100 − pct) × n_canary, divided by their gcd; weight 0 omitted).
"""
from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass
from typing import Iterable, Optional

from deployctl.config import DeployConfig, HostConfig, layout
from deployctl.errors import CheckFailed, ConfigError
from deployctl.render.release import access_log_path


def shares(stable: list[str], canary: list[str], weight: int, drained: Iterable[str] = ()) -> dict[str, float]:
    """Percent of requests per host for a split (see module doc)."""
    drained = set(drained)
    live_s = [h for h in stable if h not in drained]
    live_c = [h for h in canary if h not in drained]
    out = {h: 0.0 for h in [*stable, *canary]}
    w = weight if live_s else 100
    w = w if live_c else 0
    for h in live_c:
        out[h] = round(w / len(live_c), 3)
    for h in live_s:
        out[h] = round((100 - w) / len(live_s), 3)
    return out


@dataclass(frozen=True)
class Split:
    stable: tuple[str, ...]
    canary: tuple[str, ...]
    weight: int
    drained: tuple[str, ...] = ()

    def shares(self) -> dict[str, float]:
        return shares(list(self.stable), list(self.canary), self.weight, self.drained)

    def to_json(self) -> dict:
        return {"stable": list(self.stable), "canary": list(self.canary), "weight": self.weight,
                "drained": list(self.drained), "shares": self.shares(), "time": time.time()}


def split_for(new: list[str], old: list[str], weight: int) -> Split:
    """The split with ``new`` hosts as canary at ``weight`` over ``old``; collapses to one side when the
    other is empty (nginx weights need both sides)."""
    if not old:
        return Split(tuple(new), (), 0)
    if not new or weight <= 0:
        return Split(tuple(old), (), 0)
    return Split(tuple(old), tuple(new), weight)


def router_host_config(cfg: DeployConfig) -> HostConfig:
    if cfg.router is None:
        raise ConfigError("deploy.yaml has no router: section", fix="add router: (kind nginx, host, listen, upstream_conf)")
    return cfg.router_host()


RELOAD_WAIT_S = 5


class Router:
    """nginx on the router host. ``host`` is a deployctl.hosts.Host for router.host."""

    def __init__(self, cfg: DeployConfig, host):
        self.cfg = cfg
        self.host = host
        self.conf = cfg.router.upstream_conf
        # engine kinds of other releases behind the router now (a mixed fleet during a canary or a rollback to a
        # release on another engine): nginx's upstream keepalive_timeout must suit them too
        self.engines_behind: frozenset[str] = frozenset()

    def _nginx(self, *args: str) -> str:
        r = self.cfg.router
        parts = ['"$(command -v nginx || echo /usr/sbin/nginx)"', *args]
        if r.nginx_prefix:
            parts += ["-p", shlex.quote(r.nginx_prefix)]
        if r.nginx_conf:
            parts += ["-c", shlex.quote(r.nginx_conf)]
        return " ".join(parts)

    def apply(self, split: Split, *, guard_certificate: bool = True, sync_keys: bool = True) -> dict[str, float]:
        """Render, write, ``nginx -t``, reload. Returns the shares. With ``router.tls`` and ``guard_certificate``
        the certificate file is read first and an expired (or not yet valid, or unreadable) one is refused before
        anything changes: nginx -t accepts an expired certificate and a reload would serve it (rollback and the
        runbooks pass False: moving traffic back to stable outranks it). With ``sync_keys`` the router's API keys
        file first accepts the keys in deployctl's environment (deployctl.rollout.keys.sync_for_deploy).
        Raises CheckFailed or RemoteError."""
        from deployctl.render import render_nginx

        if guard_certificate and self.cfg.router.tls is not None:
            from deployctl.preflight.certs import file_expiry_guard

            bad = file_expiry_guard(self.host, self.cfg)
            if bad is not None:
                raise CheckFailed(f"refusing to reload nginx on {self.host.name}: {bad.message}; it keeps serving "
                                  "the certificate it has", fix=bad.fix)

        if sync_keys:
            from deployctl import settings
            from deployctl.rollout.keys import sync_for_deploy

            sync_for_deploy(self.host, self.cfg, settings.environ())
        by_name = {h.name: h for h in self.cfg.hosts}
        text = render_nginx(self.cfg, stable=[by_name[n] for n in split.stable],
                            canary=[by_name[n] for n in split.canary], canary_weight=split.weight,
                            drained=frozenset(split.drained), engines=self.engines_behind)
        q = shlex.quote
        conf, prev, new = self.conf, self.conf + ".prev", self.conf + ".new"
        self.host.put_text(text, new, mode=0o644)
        ports = {h.name: layout.service_port(self.cfg, h) for h in self.cfg.hosts if h.name in split.shares()}
        state = json.dumps({**split.to_json(), "ports": ports}, sort_keys=True)
        # one command: keep the old conf, move the new one in, nginx -t; on failure put the old one back
        script = f"""
if [ -f {q(conf)} ]; then cp -p {q(conf)} {q(prev)}; else rm -f {q(prev)}; fi
mv -f {q(new)} {q(conf)}
if ! out=$({self._nginx("-t", "-q")} 2>&1); then
  if [ -f {q(prev)} ]; then cp -p {q(prev)} {q(conf)}; else rm -f {q(conf)}; fi
  printf '%s\\n' "$out" >&2; exit 17
fi
conf_main={q(self.cfg.router.nginx_conf or "/etc/nginx/nginx.conf")}
pidf=$(awk '$1 == "pid" {{ sub(";", "", $2); print $2; exit }}' "$conf_main")
case "$pidf" in ''|/*) ;; *) pidf={q(self.cfg.router.nginx_prefix or "/etc/nginx")}/"$pidf";; esac
master=$(cat "${{pidf:-/run/nginx.pid}}" 2>/dev/null)
old=$( [ -n "$master" ] && pgrep -P "$master" | tr '\n' ' ')
{self._nginx("-s", "reload")} || exit 18
# wait (up to {RELOAD_WAIT_S} s) until the workers of the old config are gone, so that no new request can reach a
# server this config removed once we go on to stop it
i=0
while [ -n "$old" ] && [ $i -lt {RELOAD_WAIT_S * 20} ]; do
  left=0; for w in $old; do kill -0 "$w" 2>/dev/null && left=1; done
  [ $left = 0 ] && break
  sleep 0.05; i=$((i+1))
done
printf '%s\\n' {q(state)} > {q(conf + ".state.json")}
"""
        r = self.host.run(["bash", "-c", script], timeout=60, check=False)
        if r.exit_code == 17:
            msg = r.stderr.strip().splitlines()
            raise CheckFailed(f"nginx -t rejected the rendered {conf} on {self.host.name}: "
                              f"{msg[-1] if msg else 'no message'}; the previous conf was restored")
        if r.exit_code != 0:
            raise CheckFailed(f"nginx reload on {self.host.name} failed (exit {r.exit_code}): "
                              f"{(r.stderr or r.stdout).strip()[-300:]}")
        return split.shares()

    def reload(self, *, sync_keys: bool = True) -> Split:
        """Re-apply the last applied split (every host stable when none was applied): render from deploy.yaml,
        ``nginx -t``, reload. nginx re-reads its certificate files on reload, so a renewed certificate (and changed
        router settings) take effect; open streams finish on the old workers. Returns the split applied.
        Raises CheckFailed or RemoteError as apply does."""
        last = self.read_split() or {}
        names = [h.name for h in self.cfg.hosts]
        stable = [n for n in last.get("stable", []) if n in names]
        canary = [n for n in last.get("canary", []) if n in names]
        if not stable and not canary:
            stable, last = names, {}
        drained = [n for n in last.get("drained", []) if n in stable + canary]
        split = Split(tuple(stable), tuple(canary), int(last.get("weight", 0)), tuple(drained))
        self.apply(split, sync_keys=sync_keys)
        return split

    def read_split(self) -> Optional[dict]:
        """The last applied split (JSON: stable, canary, weight, drained, shares, ports) or None. A host with a
        ``spare_port`` whose active port this process has not read from the host (launcher.load_port) takes the
        port the last split routed it to, so a re-render (``router reload``, a runbook's drain) keeps pointing
        nginx where the runtime serves after a rollback onto the spare port."""
        r = self.host.run(f"cat {shlex.quote(self.conf + '.state.json')} 2>/dev/null || true", timeout=15)
        try:
            last = json.loads(r.stdout) if r.stdout.strip() else None
        except ValueError:
            return None
        ports = (last or {}).get("ports") or {}
        for h in self.cfg.hosts:
            if h.spare_port and getattr(h, "_active_port", None) is None and ports.get(h.name):
                h._active_port = int(ports[h.name])
        return last

    def access_log_size(self) -> int:
        """Bytes in the access log now (the start offset of an analysis window); 0 when there is none."""
        log = access_log_path(self.cfg)
        r = self.host.run(f"stat -c %s {shlex.quote(log)} 2>/dev/null || echo 0", timeout=15)
        try:
            return int(r.stdout.strip() or 0)
        except ValueError:
            return 0

    def access_log_since(self, offset: int) -> tuple[str, int]:
        """(text appended to the access log since ``offset``, new offset). The log is where nginx writes it
        (render.access_log_path: router.access_log, else nginx's default for the service)."""
        log = access_log_path(self.cfg)
        r = self.host.run(f"tail -c +{int(offset) + 1} {shlex.quote(log)} 2>/dev/null || true", timeout=30)
        text = r.stdout
        cut = text.rfind("\n") + 1  # only whole lines; the rest is read next time
        return text[:cut], offset + len(text[:cut].encode())
