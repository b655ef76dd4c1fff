"""Fetch one model version onto every host: deployctl/hostscripts/fetch.py run there with the host's python, at
most ``model.fetch_parallel_hosts`` hosts at once (hosts.run_on_hosts), the bytes going storage -> host.

The plan (URLs included) travels in the command's environment (over SFTP for SSH hosts, hosts/ssh.py), never
on its command line. Each host's progress lines (bytes so far, of total) reach ``on_progress(host, done, total)``.
Raises WeightsFetchFailed naming every host that failed and why (a sha256 mismatch names the file and both
hashes; a full disk names both sizes); the hosts that succeeded keep their published version.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Callable, Optional

from deployctl.config.models import ModelConfig
from deployctl.config.weights import source_name
from deployctl.errors import CheckFailed, RemoteError
from deployctl.hosts import Host, run_on_hosts
from deployctl.hostscripts import fetch as fetch_script
from deployctl.hostscripts.snippets import module_argv
from deployctl.weights.keep import versions_to_prune
from deployctl.weights.sources import FetchPlan

FETCH_TIMEOUT_S = 6 * 3600  # a 140 GB copy at 100 MB/s takes ~25 min; leave room for slow links
ProgressFn = Callable[[str, int, int], None]


class WeightsFetchFailed(RemoteError):
    """One or more hosts could not fetch the model version; ``failures`` {host: the host script's JSON}."""

    def __init__(self, message: str, failures: dict, *, fix: Optional[str] = None):
        super().__init__(message, fix=fix)
        self.failures = failures


@dataclass(frozen=True)
class HostFetch:
    """One host's result: path published, bytes fetched (this run) of bytes_total, seconds, resumed/refetched files."""

    host: str
    path: str
    bytes_fetched: int
    bytes_total: int
    seconds: float
    resumed: tuple = ()
    refetched: tuple = ()
    already: bool = False
    fallbacks: tuple = ()  # peer copy: files this host took from the source after its peer failed


def store_of(host: Host, model: ModelConfig) -> str:
    """The host's model store: model.store, under the host's deploy_root when relative."""
    if model.store.startswith("/"):
        return model.store
    return f"{host.config.deploy_root.rstrip('/')}/{model.store}"


def _one(host: Host, m: ModelConfig, plan: FetchPlan, prunable: list, on_progress: Optional[ProgressFn]) -> HostFetch:
    body = {"store": store_of(host, m), "name": source_name(m.source), "version": plan.version,
            "manifest": plan.manifest, "files": plan.files, "prunable": prunable,
            "meta": {"source": plan.source, "manifest_sha256": plan.manifest_sha256, "dtype": m.dtype,
                     "quantization": m.quantization}}

    def line(text: str) -> None:
        if on_progress is not None and text.startswith("{"):
            ev = json.loads(text)
            if ev.get("event") == "progress":
                on_progress(host.name, ev["bytes"], ev["total"])

    res = host.run(module_argv(host.config.python, fetch_script, "fetch"), timeout=FETCH_TIMEOUT_S, check=False,
                   env={"DEPLOYCTL_FETCH_PLAN": json.dumps(body)}, on_stderr=line)
    try:
        out = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        out = {"ok": False, "error": f"exit {res.exit_code}: {(res.stderr or res.stdout).strip()[-300:]}"}
    if not out.get("ok"):
        raise _HostFailed(out)
    return HostFetch(host.name, out["path"], out["bytes_fetched"], out["bytes_total"], out["seconds"],
                     tuple(out.get("resumed", ())), tuple(out.get("refetched", ())), bool(out.get("already")),
                     tuple(out.get("fallbacks", ())))


class _HostFailed(Exception):
    def __init__(self, info: dict):
        super().__init__(info.get("error", "failed"))
        self.info = info


def fetch_to_hosts(hosts: list[Host], model: ModelConfig, plan: FetchPlan, *, kept_versions: tuple = (),
                   on_progress: Optional[ProgressFn] = None) -> list[HostFetch]:
    """Fetch ``plan`` onto ``hosts`` (see the module docstring). ``kept_versions``: the model versions kept releases
    use (never pruned to make room). With ``model.peer_copy`` the hosts fetch in waves, the later ones from the
    earlier ones (deployctl.weights.peers). Returns one HostFetch per host, in order."""
    if model.peer_copy and len(hosts) > 1:
        from deployctl.weights.peers import in_waves

        return in_waves(hosts, model, plan, lambda wave, plans: _fetch_wave(wave, model, plan, plans, kept_versions,
                                                                            on_progress))
    return _fetch_wave(hosts, model, plan, {}, kept_versions, on_progress)


def _fetch_wave(hosts: list[Host], model: ModelConfig, plan: FetchPlan, plans: dict, kept_versions: tuple,
                on_progress: Optional[ProgressFn]) -> list[HostFetch]:
    """One bounded fan-out; ``plans`` {host name: FetchPlan} overrides ``plan`` for those hosts (peer URLs)."""
    outcomes = run_on_hosts(hosts, lambda h: _one(h, model, plans.get(h.name, plan), versions_to_prune(
        list_versions(h, model), plan.version, kept_versions, model.keep_versions), on_progress),
        max_workers=model.fetch_parallel_hosts, deadline_s=FETCH_TIMEOUT_S + 60, what="model fetch")
    failures = {o.host: (o.error.info if isinstance(o.error, _HostFailed) else {"error": str(o.error)})
                for o in outcomes if o.error is not None}
    if failures:
        detail = "; ".join(f"{h}: {f.get('error')}" for h, f in failures.items())
        raise WeightsFetchFailed(f"model version {plan.version} from {plan.source} did not reach "
                                 f"{len(failures)} of {len(hosts)} hosts: {detail}", failures,
                                 fix="fix the source or the host, then run `deployctl models fetch` again: finished "
                                     "files are kept and a partial file resumes")
    return [o.value for o in outcomes]


def list_versions(host: Host, model: ModelConfig) -> list[dict]:
    """The versions in the host's store for this model: [{version, partial, bytes, verified_at, source}]."""
    res = host.run(module_argv(host.config.python, fetch_script, "list", store_of(host, model),
                               source_name(model.source)), timeout=60)
    return json.loads(res.stdout)


def prune_versions(host: Host, model: ModelConfig, versions: list[str]) -> list[str]:
    """Delete these versions from the host's store; returns those deleted."""
    if not versions:
        return []
    res = host.run(module_argv(host.config.python, fetch_script, "prune", store_of(host, model),
                               source_name(model.source), *versions),
                   timeout=600)
    return json.loads(res.stdout)


def pruned_model_check(hosts: list[Host], model: ModelConfig, release_id: str, *, fetch: bool = False,
                       say: Optional[Callable[..., None]] = None) -> None:
    """Before a rollback to ``release_id``: raise CheckFailed naming the model version its release.json names and
    the hosts whose store no longer holds it (pruned), with the command that fetches it again; with ``fetch``,
    fetch it there instead (from the release's model_source, else model.source). A release without a
    model_version (a hand-placed model.path) passes."""
    from deployctl.config.layout import release_dir

    missing, version, source = [], None, None
    for h in hosts:
        res = h.run(f"cat {shlex.quote(release_dir(h.config, release_id) + '/release.json')} 2>/dev/null || true",
                    timeout=30)
        try:
            info = json.loads(res.stdout) if res.stdout.strip() else {}
        except ValueError:
            info = {}
        version, source = info.get("model_version"), info.get("model_source") or model.source
        if not version:
            continue
        meta = f"{store_of(h, model)}/{source_name(model.source)}/{version}/{fetch_script.META_NAME}"
        if h.run(f"test -f {shlex.quote(meta)}", timeout=30, check=False).exit_code != 0:
            missing.append((h.name, version))
    if missing and fetch:
        from deployctl.weights.sources import plan as make_plan

        old = model.model_copy(update={"version": missing[0][1], "source": source})
        if say is not None:
            say("info", f"fetching model {old.version} again onto {', '.join(n for n, _ in missing)} (rollback --fetch)")
        names = {n for n, _ in missing}
        fetch_to_hosts([h for h in hosts if h.name in names], old, make_plan(old))
        return
    if missing:
        versions = sorted({v for _, v in missing})
        raise CheckFailed(f"release {release_id} serves model version {', '.join(versions)}, which was pruned from "
                          f"{', '.join(n for n, _ in missing)}; nothing was changed",
                          fix="roll back with --fetch to fetch it again first (or set model.version: "
                              f"{versions[0]} and run `deployctl models fetch`)")
