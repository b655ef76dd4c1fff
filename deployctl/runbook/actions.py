"""What a failed runbook step does. ``describe`` says it in one line (dry-run, confirmation prompt);
``perform`` does it and returns one line saying what happened. Both raise DeployctlError subclasses.

restart / start / stop: the runtime on the host (deployctl.service.launcher, as the rollout). Starts wait for /readyz 200.
free_port: stop the process holding server.port (observed by a ``port`` check): the runtime's group when it is
ours, else SIGTERM then SIGKILL to the holder. adjust: set deploy.yaml keys, re-render the host's runtime.yaml,
restart. stop_standby: the host's expired standby (deployctl.rollout.standby). rollback / abort: deployctl.rollout.rollback (fleet-wide, as the commands); drain: this host out of the
router's split (deployctl.rollout.router). escalate: nothing changes; the message is the result.
"""
from __future__ import annotations

import shlex
from typing import Any

from deployctl.errors import ConfigError, RemoteError
from deployctl.runbook.checks import Observation, Target
from deployctl.runbook.model import Action


def _settings(action: Action, t: Target) -> dict[str, Any]:
    out = {}
    for key, value in action.set.items():
        if isinstance(value, str):
            value = t.fill(value)
            value = _coerce(value)
        out[key] = value
    return out


def _coerce(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def describe(action: Action, obs: Observation, t: Target) -> str:
    """One line: what ``perform`` would do on ``t``."""
    name = t.host_cfg.name
    a = action.action
    if a == "escalate":
        return f"escalate: {t.fill(action.message)}"
    if a == "free_port":
        who = "the runtime" if obs.value == "runtime" else f"pid {obs.fields.get('pid')} ({obs.fields.get('process')})"
        return f"free port {t.variables['port']} on {name}: stop {who}"
    if a == "adjust":
        changes = ", ".join(f"{k} = {v!r}" for k, v in _settings(action, t).items())
        return f"adjust {changes} in {t.config_path or 'deploy.yaml'}, re-render runtime.yaml on {name}, restart the runtime"
    if a in ("restart", "start", "stop"):
        return f"{a} the runtime on {name}"
    if a == "stop_standby":
        return f"stop the expired standby on {name} (deployctl.rollout.standby)"
    if a in ("cordon", "uncordon"):
        return f"{a} {name} (deployctl.rollout.cordon)"
    from deployctl.runbook.text import ACTION_TEXT

    return f"{ACTION_TEXT[a]}, from {name}" + ("" if a == "drain" else " (fleet-wide)")


def perform(action: Action, obs: Observation, t: Target) -> str:
    """Do ``action`` on ``t``; returns what happened. Raises DeployctlError when it cannot."""
    a = action.action
    if a == "escalate":
        return f"escalated: {t.fill(action.message)}"
    if a == "start":
        return _start(t) + "; " + _wait_ready(t, action.timeout_s)
    if a == "stop":
        return _stop(t)
    if a == "restart":
        return _stop(t) + "; " + _start(t) + "; " + _wait_ready(t, action.timeout_s)
    if a == "free_port":
        return _free_port(obs, t)
    if a == "adjust":
        return _adjust(action, t) + "; " + _wait_ready(t, action.timeout_s)
    if a == "stop_standby":
        return _stop_standby(t)
    if a in ("cordon", "uncordon"):
        return _cordon(a, t)
    return _rollout(a, t)


def _cordon(a: str, t: Target) -> str:
    """hosts cordon / uncordon of ``t``'s host (deployctl.rollout.cordon), its lines joined. Raises DeployctlError."""
    from deployctl.rollout import cordon

    said: list[str] = []
    if a == "cordon":
        cordon.cordon(t.cfg, t.host_cfg.name, reason="runbook host-maintenance", say=said.append)
    else:
        cordon.uncordon(t.cfg, t.host_cfg.name, say=said.append)
    return "; ".join(said)


def _stop_standby(t: Target) -> str:
    """Stop the host's standby when it has expired (rollout.standby_s past); a valid one is left asleep.
    Raises RemoteError."""
    from deployctl.rollout import standby

    rec = standby.read(t.host)
    if rec is None:
        return "no standby on this host"
    if not rec.expired:
        return f"the standby of {rec.release} is valid until {rec.to_json()['expires']}: left asleep"
    standby.stop(t.host, t.cfg, rec)
    return f"stopped the expired standby of {rec.release} on port {rec.port}"


def _start(t: Target) -> str:
    """Start the release ``current`` points at on ``t``, on the port it serves on (the spare port after a rollback
    there: Engine.start_in_place). Raises RemoteError."""
    from deployctl.service.engine import Engine

    Engine(t.host, t.cfg).start_in_place()
    return f"started the runtime on {t.host_cfg.name} ({t.host_cfg.launcher} launcher)"


def _stop(t: Target) -> str:
    """Stop the runtime (drain, then SIGKILL to its process group after the drain timeout). Raises RemoteError."""
    from deployctl.service.engine import Engine

    how = Engine(t.host, t.cfg).stop()
    return "the runtime was not running" if how == "not running" else f"runtime {how}"


def _wait_ready(t: Target, timeout: float) -> str:
    """Wait for /readyz 200 (the engine handle's wait_ready): a (re)start is done when the runtime serves.
    Raises HealthError (exit 5)."""
    from deployctl.service.engine import Engine

    return f"ready after {Engine(t.host, t.cfg).wait_ready(timeout=timeout):.1f} s"


def _free_port(obs: Observation, t: Target) -> str:
    if obs.value == "runtime":
        return _stop(t)
    pid = obs.fields.get("pid")
    if not pid:
        return f"port {t.variables['port']} was already free"
    from deployctl.service import launcher

    how = launcher.kill_pid(t.host, int(pid))
    return f"stopped pid {pid} ({obs.fields.get('process')}) holding port {t.variables['port']}" + (" with SIGKILL" if how == "KILL" else "")


def _adjust(action: Action, t: Target) -> str:
    from pathlib import Path

    from deployctl.config import parse_config
    from deployctl.runbook.context import host_variables
    from deployctl.config.yamledit import set_key

    if not t.config_path:
        raise ConfigError("action adjust needs the deploy.yaml it changes", fix="pass -c deploy.yaml")
    path = Path(t.config_path)
    text = path.read_text()
    changes = _settings(action, t)
    for key, value in changes.items():
        try:
            text = set_key(text, key, value)
        except ValueError as exc:
            raise ConfigError(f"{path}: cannot set {key}: {exc}") from None
    new_cfg = parse_config(text, str(path))  # refuses values deploy.yaml would refuse, before anything changes
    path.write_text(text)
    t.cfg = new_cfg
    t.variables = host_variables(new_cfg, t.host_cfg)
    where = _rerender_runtime_yaml(t)
    done = ", ".join(f"{k} = {v!r}" for k, v in changes.items())
    return f"set {done} in {path}; re-rendered {where}; " + _stop(t) + "; " + _start(t)


def _rerender_runtime_yaml(t: Target) -> str:
    """Render runtime.yaml for ``t.cfg`` and write it over ``<current>/runtime.yaml`` on the host, keeping the
    release's manifest.sha256 line for it true; the release id stays the current one. Returns the path written.
    Raises RemoteError, ConfigError."""
    from deployctl.render import render_release

    v = t.variables
    path = v["runtime_yaml"]
    res = t.host.run(f"readlink -f {shlex.quote(v['current'])}", timeout=30, check=False)
    release_dir = res.stdout.strip()
    if res.exit_code != 0 or not release_dir or not t.host.exists(path):
        raise RemoteError(f"{t.host_cfg.name}: no current release under {v['deploy_root']}; nothing to re-render",
                          fix="install a release first (`deployctl deploy`)")
    release_id = release_dir.rsplit("/", 1)[-1]
    files = {f.path: f for f in render_release(t.cfg, t.host_cfg, release_id, api_key=None)}
    rendered = files["runtime.yaml"]
    t.host.put_text(rendered.content, path, mode=rendered.mode)
    manifest = f"{release_dir}/manifest.sha256"
    if t.host.exists(manifest):
        lines = [f"{rendered.sha256}  runtime.yaml" if line.endswith("  runtime.yaml") else line
                 for line in t.host.read_text(manifest).splitlines()]
        t.host.put_text("\n".join(lines) + "\n", manifest)
    return path


def _rollout(name: str, t: Target) -> str:
    """abort / rollback: fleet-wide, as `deployctl abort` / `deployctl rollback`; drain: this host's router weight
    to 0, the rest of the split as it is."""
    from deployctl.rollout.rollback import rollback, signal

    if name == "abort":
        return signal(t.cfg, "abort")
    if name == "rollback":
        r = rollback(t.cfg)
        if r.noop:
            return f"every host already runs {r.target}: nothing to roll back"
        return f"rolled back to {r.target} on {', '.join(r.changed) or 'no host'} in {r.duration_s:.1f} s"
    return _drain(t)


def _drain(t: Target) -> str:
    from deployctl.hosts import Host
    from deployctl.rollout.router import Router, Split, router_host_config

    host = Host.from_config(router_host_config(t.cfg))
    try:
        router = Router(t.cfg, host)
        split = router.read_split() or {"stable": [h.name for h in t.cfg.hosts], "canary": [], "weight": 0,
                                         "drained": []}
        drained = sorted(set(split.get("drained") or []) | {t.host_cfg.name})
        shares = router.apply(Split(tuple(split["stable"]), tuple(split["canary"]), int(split["weight"]),
                                    tuple(drained)), guard_certificate=False)
    finally:
        host.close()
    return f"drained {t.host_cfg.name}: traffic " + ", ".join(f"{h} {w:g}%" for h, w in shares.items())
