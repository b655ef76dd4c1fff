"""Observe one value on a host for a runbook step. Each check kind returns an ``Observation``; connection
failures of the runtime are observations (HTTP status 0), SSH failures raise RemoteError (exit 4).

Kinds: http (a request to the runtime, sent from the host), metric (/metrics, Prometheus text; histogram
quantiles as Prometheus' histogram_quantile, via deployctl.promhist), log (grep -E over the log's tail),
command (shell), preflight (one preflight check by name), setting (the current release's runtime.yaml),
capacity (the capacity plan), port (who holds server.port), process (is the runtime alive: the pidfile's
process, or the systemd unit).
"""
from __future__ import annotations

import json
import math
import shlex
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from deployctl.config import DeployConfig, HostConfig
from deployctl.errors import CheckFailed, ConfigError
from deployctl.hostscripts import snippets as remote
from deployctl.runbook.context import fill
from deployctl.runbook.model import Step


@dataclass
class Observation:
    """What a check saw: ``value`` is compared with the step's expect; ``fields`` are extra facts
    (recordable with ``record:``); ``detail`` is one line for people."""

    value: Any
    fields: dict[str, Any] = field(default_factory=dict)
    detail: str = ""
    no_data: bool = False  # the metric exists but has nothing to judge yet (a histogram without observations)
    cannot_judge: str = ""  # why the value is not judged: too few observations for the statistic ("" when judged)


@dataclass
class Target:
    """One host a runbook runs on, with what the steps share."""

    cfg: DeployConfig
    host_cfg: HostConfig
    host: Any  # deployctl.hosts.Host
    variables: dict[str, Any]
    observed: dict[str, Observation] = field(default_factory=dict)
    config_path: Optional[str] = None
    pending_audit: list[dict[str, Any]] = field(default_factory=list)
    plan_facts: Optional[dict[str, Any]] = None  # host facts behind the capacity plan (capacity_plan), probed once a run

    def fill(self, text: str, *, quote: bool = False) -> str:
        return fill(text, self.variables, self.observed, quote=quote)

    def script(self, script: str, args: dict[str, Any], timeout: float) -> dict[str, Any]:
        res = self.host.run(remote.script_argv(self.host_cfg.python, script, args), timeout=timeout)
        return json.loads(res.stdout.strip().splitlines()[-1])

    def http(self, path: str, *, method: str = "GET", body: Any = None, timeout: float = 10):
        """One request to the runtime on this host (the engine handle's http): an HttpResult."""
        from deployctl.service.engine import Engine

        return Engine(self.host, self.cfg).http(method, path, body, timeout=timeout)


def _http(t: Target, step: Step) -> Observation:
    spec = step.check.http
    r = t.http(t.fill(spec.path), method=spec.method, body=_fill_json(t, spec.json_body), timeout=step.timeout_s)
    detail = f"{spec.method} {spec.path}: " + (f"HTTP {r.status}" if r.status else (r.error or "no answer"))
    fields = {"status": r.status, "elapsed_s": round(r.elapsed_s, 4), "error": r.error or None, "body": r.body[:500]}
    return Observation(fields[spec.field], fields, detail)


def _fill_json(t: Target, value: Any) -> Any:
    """Fill {variables} in the strings of a JSON body; a string that is one placeholder keeps the value's type."""
    if isinstance(value, str):
        filled = t.fill(value)
        if value.startswith("{") and value.endswith("}") and value.count("{") == 1:
            return _typed(filled)
        return filled
    if isinstance(value, dict):
        return {k: _fill_json(t, v) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill_json(t, v) for v in value]
    return value


def _typed(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def metric_name(kind: str, name: str):
    """A runbook's metric: a role of deployctl.engines.base.METRIC_ROLES (ttft, tpot, e2e, kv_usage, waiting, ...)
    resolved through engine ``kind``'s adapter (None when it has none), or a literal Prometheus name."""
    from deployctl.engines import METRIC_ROLES, metric

    return metric(kind, name) if name in METRIC_ROLES else name


def _metric(t: Target, step: Step) -> Observation:
    from deployctl import promhist

    spec = step.check.metric
    name = metric_name(t.cfg.engine.kind, spec.name)
    if name is None:
        return Observation(None, {}, f"{spec.name}: {t.cfg.engine.kind} exports no such metric", no_data=True)
    spec = spec.model_copy(update={"name": name})

    def scrape() -> list:
        r = t.http("/metrics", timeout=step.timeout_s)
        if r.status != 200:
            return []
        return promhist.parse_text(r.body)

    def matching(samples: list, name: str) -> list:
        return [s for s in samples if s.name == name and all(s.label(k) == v for k, v in spec.labels.items())]

    first = scrape()
    if not first:
        return Observation(None, {"error": "no /metrics answer"}, f"{spec.name}: the runtime's /metrics did not answer")
    if spec.stat == "present":
        found = bool(matching(first, spec.name) or matching(first, spec.name + "_count"))
        return Observation(found, {}, f"{spec.name}: {'present' if found else 'missing'}")
    last = first
    if spec.window_s:
        time.sleep(spec.window_s)
        last = scrape() or first
    if spec.stat in ("value", "increase"):
        now = matching(last, spec.name)
        if not now:
            return Observation(None, {}, f"{spec.name}: not exported")
        value = sum(s.value for s in now)
        if spec.stat == "increase":
            value -= sum(s.value for s in matching(first, spec.name))
        return Observation(value, {}, f"{spec.name}{'' if spec.stat == 'value' else f' increase over {spec.window_s:g}s'} = {value:g}")
    hist = promhist.histogram(last, spec.name, spec.labels)
    if spec.window_s:
        hist = hist - promhist.histogram(first, spec.name, spec.labels)
    fields = {"count": hist.count, "sum": round(hist.sum, 6)}
    if spec.stat == "count":
        return Observation(hist.count, fields, f"{spec.name}: {hist.count:g} observations")
    if not hist.count:
        return Observation(None, fields, f"{spec.name}: no observations yet (nothing to judge)", no_data=True)
    mean = hist.sum / hist.count
    fields["mean"] = round(mean, 6)
    needed = spec.samples_needed
    if hist.count < needed:  # the statistic would be the slowest request, not a tail: nothing to compare
        what = f"P{spec.q * 100:g}" if spec.q is not None else spec.stat
        reason = f"cannot judge: {hist.count:g} samples ({what} needs >= {needed})"
        return Observation(None, fields, f"{spec.name} {reason}", cannot_judge=reason)
    if spec.q is not None:
        fields["quantile"] = round(hist.quantile(spec.q), 6)
    if spec.stat == "mean":
        value, label = mean, "mean"
    elif spec.stat == "quantile":
        value, label = hist.quantile(spec.q), f"P{spec.q * 100:g}"
    else:
        value, label = (hist.quantile(spec.q) / mean if mean > 0 else math.nan), f"P{spec.q * 100:g} / mean"
    value = None if math.isnan(value) else round(value, 6)
    unit = "" if spec.stat == "tail_ratio" else " s"
    extra = f" (P{spec.q * 100:g} {fields['quantile']:.4g} s, mean {mean:.4g} s)" if spec.stat == "tail_ratio" else ""
    return Observation(value, fields, f"{spec.name} {label} = {value}{unit}{extra} over {hist.count:g} requests")


def _log(t: Target, step: Step) -> Observation:
    spec = step.check.log
    path = t.fill(spec.file)
    cmd = (f"test -f {shlex.quote(path)} || {{ echo MISSING; exit 0; }}; "
           f"tail -n {spec.last_lines} {shlex.quote(path)} | grep -E -- {shlex.quote(t.fill(spec.pattern))} || true")
    out = t.host.run(cmd, timeout=step.timeout_s).stdout.splitlines()
    if out == ["MISSING"]:
        return Observation(0, {"last_match": None, "log_present": False}, f"{path}: no such file")
    last = out[-1][:400] if out else None
    return Observation(len(out), {"last_match": last, "log_present": True},
                       f"{len(out)} lines match {spec.pattern!r}" + (f"; last: {last}" if last else ""))


def _command(t: Target, step: Step) -> Observation:
    spec = step.check.command
    res = t.host.run(t.fill(spec.run, quote=True), timeout=step.timeout_s, check=False)
    fields = {"exit_code": res.exit_code, "stdout": res.stdout.strip()[-500:], "stderr": res.stderr.strip()[-500:]}
    tail = (fields["stderr"] or fields["stdout"]).splitlines()[-1:] if res.exit_code else fields["stdout"].splitlines()[-1:]
    return Observation(fields[spec.field], fields, f"exit {res.exit_code}" + (f": {tail[0][:200]}" if tail else ""))


def _setting(t: Target, step: Step) -> Observation:
    import yaml

    key = step.check.setting.key
    path = t.variables["runtime_yaml"]
    if not t.host.exists(path, timeout=step.timeout_s):
        return Observation(None, {}, f"{path}: no such file (no release installed?)")
    data = yaml.safe_load(t.host.read_text(path, timeout=step.timeout_s)) or {}
    value = data.get(key) if isinstance(data, dict) else None
    return Observation(value, {}, f"{key} = {value!r} in {path}")


def capacity_plan(t: Target):
    """The preflight's capacity plan for ``t`` from the host's own facts (config.json and safetensors headers from
    its model directory, GPU memory from its NVML) with deploy.yaml's current engine settings: a
    deployctl.capacity.CapacityPlan. Raises CheckFailed when the host's facts cannot size it (no config.json, GPU
    unknown), RemoteError for SSH."""
    from deployctl.preflight.capacity import plan_from_facts
    from deployctl.preflight.gather import host_facts

    # the model's config and the GPU's size do not change within a run: probe the host once
    if t.plan_facts is None:
        t.plan_facts = host_facts(t.host, t.cfg, verify_weights=False)
    sized, reason = plan_from_facts(t.cfg, t.host_cfg, t.plan_facts)
    if sized is None:
        raise CheckFailed(f"no capacity plan for {t.host_cfg.name}: {reason}", fix="run `deployctl preflight` and fix what it names")
    return sized.plan


def _capacity(t: Target, step: Step) -> Observation:
    name = step.check.capacity.field
    plan = capacity_plan(t)
    value = getattr(plan, name)
    value = round(value, 3) if isinstance(value, float) else value
    return Observation(value, {"max_feasible_num_seqs": plan.max_feasible_num_seqs,
                               "max_feasible_model_len": plan.max_feasible_model_len,
                               "kv_pool_tokens": plan.kv_pool_tokens},
                       f"capacity plan: {name} = {value} (pool {plan.kv_pool_tokens} tokens, "
                       f"max_model_len {plan.max_model_len}, max_num_seqs {plan.max_num_seqs})")


def _port(t: Target, step: Step) -> Observation:
    v = t.variables
    from deployctl.service import launcher

    r = launcher.port_holder(t.host, t.cfg, timeout=step.timeout_s)
    detail = {"free": f"port {v['port']} is free",
              "runtime": f"port {v['port']} is held by the runtime (pid {r['pid']})",
              "other": f"port {v['port']} is held by pid {r['pid']} ({r['process']}), not the runtime of {v['pid_file']}"}
    return Observation(r["value"], {k: r[k] for k in ("pid", "process", "pidfile_pid")}, detail[r["value"]])


def _process(t: Target, step: Step) -> Observation:
    if t.host_cfg.launcher == "systemd":
        from deployctl.config.layout import unit_name
        from deployctl.service.engine import Engine

        alive = Engine(t.host, t.cfg).running()
        return Observation(alive, {"pid": None}, f"{unit_name(t.cfg, t.host_cfg)} is {'active' if alive else 'not active'}")
    r = t.script(remote.PROCESS_ALIVE, {"pid_file": t.variables["pid_file"],
                                        "child_pid_file": t.variables["child_pid_file"]}, step.timeout_s)
    pid = r["pid"]
    if r["runtime"] and not r["supervisor"]:
        detail = (f"the runtime (pid {r['runtime_pid']}) runs unsupervised: its supervisor launch.sh"
                  f"{f' (pid {pid})' if pid else ''} is not running, so nothing restarts it")
    elif r["value"]:
        detail = (f"supervisor pid {pid} and runtime pid {r['runtime_pid']} are alive" if r["runtime_pid"]
                  else f"runtime pid {pid} is alive")
    else:
        detail = f"runtime pid {pid} is not running" if pid else "no runtime pidfile"
    return Observation(r["value"], {"pid": pid}, detail)


def _preflight(t: Target, step: Step) -> Observation:
    """Preflight check ``name`` on ``t`` with fresh facts from the probe (weights hashed only for the ``weights``
    check): value = status (pass, warn, fail); fields message, fix. Raises RemoteError (SSH), ConfigError."""
    from deployctl.preflight.checks import PREFLIGHT_CHECKS, run_checks
    from deployctl.preflight.gather import host_facts

    name = step.check.preflight.name
    facts = host_facts(t.host, t.cfg, verify_weights=name == "weights")
    found = [c for c in run_checks(t.cfg, t.host_cfg, facts) if c.name == name]
    if not found:
        raise ConfigError(f"preflight check {name!r} does not exist", fix=f"use one of: {', '.join(PREFLIGHT_CHECKS)}")
    c = found[0]
    return Observation(c.status, {"message": c.message, "fix": c.fix}, f"preflight {name}: {c.status}: {c.message}")


CHECKS: dict[str, Callable[[Target, Step], Observation]] = {
    "http": _http, "metric": _metric, "log": _log, "command": _command, "setting": _setting,
    "capacity": _capacity, "port": _port, "process": _process, "preflight": _preflight,
}


def observe(t: Target, step: Step) -> Observation:
    """Run ``step``'s check once on ``t``. Raises RemoteError (SSH), ConfigError (bad inputs)."""
    try:
        return CHECKS[step.check.kind](t, step)
    except (json.JSONDecodeError, IndexError) as exc:
        raise ConfigError(f"step {step.id}: the host's python {t.host_cfg.python} gave no JSON answer ({exc})",
                          fix="set hosts[].python to a Python 3 on that host") from None
