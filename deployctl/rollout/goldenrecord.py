"""Each release's own golden answers, recorded once and asked again wherever an engine of that release comes back
(issue 39): after a standby's wake, after an abort's restore, after a rollback's cold start, and before the router
gives that host any weight.

The record: ``<deploy_root>/shared/golden/<release>.json`` on every host of the fleet (small: the prompts and
their greedy answers), written when the release first answers the golden prompts in a deploy's comparison at
weight 0 (deployctl.rollout.outputgate): stable's answers become the stable release's record when it has none, a
canary host's answers that passed become the new release's. So a release that was ever stable or a passing canary
has a record; one that never was (the fleet's first release before any later deploy, or golden outputs off) has
none, and its engines are then verified by readiness and one sample request alone, which ``check`` says.

``check(host, cfg, release, port)`` asks the record's own prompts (same ``max_tokens``, chat or completion as
recorded) of the engine on ``port`` and judges them against the record under the deploy's agreement rule
(deployctl.rollout.outputcheck, ``exact``: the same release on the same weights, engine and dtype) with the
degenerate checks (empty answers, loops, garbled text). A difference raises ``GoldenMismatch`` (a HealthError,
exit 5) naming the host, the prompt and the first differing token.
"""
from __future__ import annotations

import json
import posixpath
import shlex
import time
from dataclasses import dataclass
from typing import Optional

from deployctl.config import DeployConfig
from deployctl.config.layout import network_address, shared_dir, url_host
from deployctl.errors import HealthError
from deployctl.rollout.golden import Answer, Prompt, collect
from deployctl.rollout.outputcheck import OutputReport, Rules, compare

FORMAT = 1


class GoldenMismatch(HealthError):
    """An engine's golden answers differ from its release's record: ``report`` (outputcheck.OutputReport)."""

    def __init__(self, message: str, report: OutputReport, fix: str = ""):
        super().__init__(message, fix=fix)
        self.report = report


@dataclass(frozen=True)
class Record:
    """One release's golden answers: ``prompts`` and ``answers`` in the same order, ``chat`` (asked through
    /v1/chat/completions, else /v1/completions), ``max_tokens``, ``source`` (which host answered, in which step),
    ``recorded_at`` (Unix seconds)."""

    release: str
    prompts: tuple
    answers: tuple
    chat: bool
    max_tokens: int
    source: str
    recorded_at: float

    def to_json(self) -> dict:
        return {"format": FORMAT, "release": self.release, "chat": self.chat, "max_tokens": self.max_tokens,
                "source": self.source, "recorded_at": self.recorded_at,
                "prompts": [{"id": p.id, "messages": p.messages, "prompt": p.prompt} for p in self.prompts],
                "answers": [a.to_json() for a in self.answers]}

    @classmethod
    def from_json(cls, d: dict) -> "Record":
        """Raises ValueError / KeyError / TypeError on another shape."""
        prompts = tuple(Prompt(str(p["id"]), messages=p.get("messages"), prompt=p.get("prompt")) for p in d["prompts"])
        answers = tuple(Answer(**{k: v for k, v in a.items() if k in Answer.__dataclass_fields__})
                        for a in d["answers"])
        if len(prompts) != len(answers) or not prompts:
            raise ValueError("prompts and answers differ in number")
        return cls(str(d["release"]), prompts, answers, bool(d["chat"]), int(d["max_tokens"]), str(d.get("source", "")),
                   float(d.get("recorded_at", 0)))


def path(h, release_id: str) -> str:
    """Where ``release_id``'s record lives on host ``h`` (HostConfig)."""
    return shared_dir(h, "golden", f"{release_id}.json")


def read(host, release_id: str) -> Optional[Record]:
    """The record of ``release_id`` on ``host``, or None (none, or unreadable). Raises RemoteError."""
    r = host.run(f"cat {shlex.quote(path(host.config, release_id))} 2>/dev/null || true", timeout=15)
    if not r.stdout.strip():
        return None
    try:
        return Record.from_json(json.loads(r.stdout))
    except (ValueError, KeyError, TypeError):
        return None


def make(release_id: str, prompts: list, answers: list, *, chat: bool, max_tokens: int, source: str) -> Optional[Record]:
    """A record from a complete set of answers; None when any prompt went unanswered (an error): a record is only
    made of answers that every prompt got."""
    if not prompts or len(answers) != len(prompts) or any(a.error for a in answers):
        return None
    return Record(release_id, tuple(prompts), tuple(answers), chat, max_tokens, source, time.time())


def write(host, rec: Record) -> None:
    """Write ``rec`` on ``host`` (atomically: Host.put_text). Raises RemoteError."""
    host.run(["mkdir", "-p", posixpath.dirname(path(host.config, rec.release))], timeout=15)
    host.put_text(json.dumps(rec.to_json(), sort_keys=True) + "\n", path(host.config, rec.release), mode=0o644)


def save(hosts: dict, rec: Optional[Record], *, workers: int = 8, only_missing: bool = False,
         say=None) -> list[str]:
    """Write ``rec`` on every host of ``hosts`` ({name: Host}), ``workers`` at once; with ``only_missing``
    a host that already holds a record of that release keeps it (a release's record is the one from when it was
    first verified). Returns the hosts written. Failures are said (``say``) and skipped: a missing record costs the
    check, never the deploy."""
    if rec is None:
        return []

    def one(h):
        if only_missing and read(h, rec.release) is not None:
            return False
        write(h, rec)
        return True

    from deployctl.hosts import run_on_hosts

    outcomes = run_on_hosts(list(hosts.values()), one, max_workers=workers) if hosts else []
    ok = {o.host: o.value for o in outcomes if o.error is None}
    bad = {o.host: o.error for o in outcomes if o.error is not None}
    for n, e in bad.items():
        if say:
            say("warn", f"{n}: could not record the golden answers of {rec.release}: {e}", host=n)
    return [n for n, v in ok.items() if v]


def engine_url(cfg: DeployConfig, h, port: int) -> str:
    """``http://address:port`` of the engine on host ``h`` (HostConfig) at ``port``, as the router reaches it."""
    return f"http://{url_host(network_address(h))}:{int(port)}"


def rules(cfg: DeployConfig) -> Rules:
    """The agreement rule for an engine against its own release's record: ``exact`` with the deploy's thresholds."""
    o = cfg.rollout.analysis.outputs
    return Rules("exact", "the release's own recorded answers (same weights, engine and dtype)",
                 min_exact_share=o.min_exact_share, min_prefix_tokens=o.min_prefix_tokens,
                 min_prefix_share=o.min_prefix_share, max_repeats=o.max_repeats,
                 min_length_ratio=o.min_length_ratio, max_length_ratio=o.max_length_ratio)


def first_difference(rep: OutputReport) -> str:
    """"prompt 3 ('Write a haiku…'), token 0: recorded 'The' 'sea', now '' (15/16 prompts as recorded)" from a
    failed report (its reason when no prompt differs: an error, a degenerate answer)."""
    if not rep.diffs:
        return rep.reason or "; ".join(rep.problems)
    d = rep.diffs[0]
    shown = lambda toks: " ".join(repr(t) for t in (toks or [])[:4]) or "nothing"  # noqa: E731
    return (f"{d.get('label') or 'prompt ' + str(d.get('prompt'))}, token {d.get('at')}: recorded {shown(d.get('stable'))}, "
            f"now {shown(d.get('canary'))} ({rep.identical}/{rep.total} prompts as recorded)")


def check(host, cfg: DeployConfig, release_id: str, port: int, *, when: str) -> Optional[OutputReport]:
    """Ask the engine of ``release_id`` on ``host`` at ``port`` its record's prompts and judge the answers
    (module doc). ``when`` says where in the command this happens ("after the wake"), for the error. Returns the
    passing report, or None when the release has no record or golden outputs are off
    (rollout.analysis.outputs.enabled). Raises GoldenMismatch (exit 5) on a difference, RemoteError on SSH
    trouble."""
    if not cfg.rollout.analysis.outputs.enabled:
        return None
    rec = read(host, release_id)
    if rec is None:
        return None
    from deployctl.service.http import api_key

    o = cfg.rollout.analysis.outputs
    answers = collect(engine_url(cfg, host.config, port), cfg.model.name, list(rec.prompts), chat=rec.chat,
                      max_tokens=rec.max_tokens, api_key=api_key(cfg), timeout=o.timeout_s)
    rep = compare(list(rec.prompts), list(rec.answers), answers, rules(cfg), canary_host=host.name,
                  stable_host=f"the record of {release_id}")
    if rep.result == "pass":
        return rep
    raise GoldenMismatch(f"{host.name}: {release_id} on port {port} {when} does not give its recorded golden answers: "
                         f"{first_difference(rep)}", rep,
                         fix=f"this engine is not serving what {release_id} served; see the runtime log on "
                             f"{host.name} (shared/logs/runtime.log)")
