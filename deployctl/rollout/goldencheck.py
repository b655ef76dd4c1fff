"""The golden-output check at a canary step: ask every canary host and one stable host the golden prompts
(deployctl.rollout.golden, directly at their host URLs, not through the router) and judge the answers
(deployctl.rollout.outputcheck).

Which agreement rule applies comes from the two releases (their release directories on the hosts):
- the weight files' hashes (``model.manifest.sha256`` lines for ``*.safetensors``, ``*.bin``, ``*.pt``,
  ``*.pth``, ``*.gguf``) differ → ``outputs.on_model_change``: ``check`` (default) keeps the agreement rule,
  ``skip`` leaves only the degenerate checks;
- the engine (``release.json`` ``engine``, else the runtime wheel's project name) or ``dtype`` (runtime.yaml)
  differ → ``prefix``;
- else ``exact``.
The reason also names which of the model's tokenizer.json, tokenizer_config.json (chat template),
generation_config.json and config.json changed (release.json ``model_files``; "no file changed" when none did;
releases without it say nothing): "exact: same weights, engine and dtype; changed: tokenizer_config.json (chat
template)".
The model has a chat template when the canary's model directory holds ``chat_template.jinja`` or a
``chat_template`` in tokenizer_config.json; then prompts go to /v1/chat/completions, else /v1/completions.
Stable's answers are asked once per deploy (stable does not change during it). ``start`` runs the check in a
background thread beside the step's analysis windows (a slow canary is aborted on latency meanwhile); ``stop``
makes it give up between prompts.
"""
from __future__ import annotations

import hashlib
import json
import posixpath
import shlex
import threading
import time
from dataclasses import dataclass
from typing import Optional

from deployctl.config import DeployConfig
from deployctl.rollout.golden import Answer, collect, default_prompts, load_prompts
from deployctl.rollout.outputcheck import OutputReport, Rules, compare
from deployctl.config.layout import release_dir

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_SEP = "\n--deployctl-sep--\n"


@dataclass(frozen=True)
class Identity:
    """What decides the agreement rule for one release: the weights digest, the engine and the dtype."""

    weights: str
    engine: str
    dtype: str
    files: tuple = ()  # sorted (name, sha256) of release.json model_files; () when the release has none


def parse_identity(release_json: str, manifest: str, runtime_yaml: str) -> Identity:
    """An Identity from a release directory's files (missing pieces read as empty strings)."""
    try:
        rel = json.loads(release_json) if release_json.strip() else {}
    except ValueError:
        rel = {}
    lines = sorted(ln.strip() for ln in manifest.splitlines()
                   if ln.strip() and ln.strip().split()[-1].endswith(WEIGHT_SUFFIXES))
    weights = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12] if lines else ""
    engine = str(rel.get("engine_kind") or rel.get("engine") or str(rel.get("runtime_wheel") or "").split("-")[0])
    if engine in ("deployctl_runtime", "deployctl-runtime"):  # the bundled runtime, named either way
        engine = "deployctl-runtime"
    dtype = ""
    for ln in runtime_yaml.splitlines():
        key, _, val = ln.partition(":")
        if key.strip() == "dtype":
            dtype = val.strip().strip("'\"")
    files = rel.get("model_files") if isinstance(rel.get("model_files"), dict) else {}
    return Identity(weights, engine, dtype, tuple(sorted(files.items())))


FILE_ROLES = {"tokenizer_config.json": "chat template", "generation_config.json": "generation defaults",
              "tokenizer.json": "tokenizer", "config.json": "model config"}


def changed_files(stable: Identity, canary: Identity) -> list[str]:
    """The model files whose sha256 differs between the releases (added or removed count), with their role;
    empty when either release did not record them."""
    if not stable.files or not canary.files:
        return []
    a, b = dict(stable.files), dict(canary.files)
    return [f"{n} ({FILE_ROLES.get(n, 'file')})" for n in sorted(set(a) | set(b)) if a.get(n) != b.get(n)]


def rules_for(cfg: DeployConfig, stable: Identity, canary: Identity) -> Rules:
    o = cfg.rollout.analysis.outputs
    common = dict(min_exact_share=o.min_exact_share, min_prefix_tokens=o.min_prefix_tokens,
                  min_prefix_share=o.min_prefix_share, max_repeats=o.max_repeats,
                  min_length_ratio=o.min_length_ratio, max_length_ratio=o.max_length_ratio)
    changed = [f"{k} {getattr(stable, k) or '?'} → {getattr(canary, k) or '?'}" for k in ("engine", "dtype")
               if getattr(stable, k) != getattr(canary, k)]
    files = changed_files(stable, canary)
    # which model files changed, when both releases recorded them (an older release: nothing said, not "none")
    also = f"; changed: {', '.join(files)}" if files else "; no file changed" if stable.files and canary.files else ""
    if stable.weights != canary.weights:
        wc = f"weights changed {stable.weights or '?'} → {canary.weights or '?'}"
        if o.on_model_change == "skip":
            return Rules("skip", f"{wc}, outputs.on_model_change skip{also}", **common)
        return Rules("prefix" if changed else "exact",
                     f"{wc}, outputs.on_model_change check" + (f"; {', '.join(changed)}" if changed else "") + also,
                     **common)
    if changed:
        return Rules("prefix", ", ".join(changed) + also, **common)
    return Rules("exact", "same weights, engine and dtype" + also, **common)


def _cat(host, paths: list[str]) -> list[str]:
    q = shlex.quote
    script = f"; printf '%s' {q(_SEP)}; ".join(f"cat {q(p)} 2>/dev/null" for p in paths)
    r = host.run(["bash", "-c", script + "; true"], timeout=30, check=False)
    parts = r.stdout.split(_SEP)
    return parts + [""] * (len(paths) - len(parts))


def read_identity(host, release_id: str) -> Identity:
    d = release_dir(host.config, release_id)
    return parse_identity(*_cat(host, [posixpath.join(d, f) for f in ("release.json", "model.manifest.sha256",
                                                                       "runtime.yaml")]))


def has_chat_template(host, cfg: DeployConfig) -> bool:
    tc, jinja = _cat(host, [posixpath.join(cfg.model.path, "tokenizer_config.json"),
                            posixpath.join(cfg.model.path, "chat_template.jinja")])
    if jinja.strip():
        return True
    try:
        return bool(json.loads(tc).get("chat_template")) if tc.strip() else False
    except (ValueError, AttributeError):
        return False


class GoldenCheck:
    """The check for one deploy. ``hosts``: name -> deployctl.hosts.Host."""

    def __init__(self, cfg: DeployConfig, hosts: dict, canary_release: str, stable_release: Optional[str]):
        from deployctl.service.http import api_key

        self.cfg, self.hosts = cfg, hosts
        self.canary_release, self.stable_release = canary_release, stable_release
        o = cfg.rollout.analysis.outputs
        self.prompts = load_prompts(o.prompts) if o.prompts else default_prompts()
        self.key = api_key(cfg)
        self.chat: Optional[bool] = None
        self._stable: Optional[tuple[str, list[Answer]]] = None
        self._rules: dict[str, Rules] = {}
        self.stopped = threading.Event()
        self.asked: dict[str, tuple[float, list[Answer]]] = {}  # host -> (monotonic start, answers so far)
        self.asked_took: dict[str, float] = {}  # host -> seconds it took to answer every prompt (once done)
        self.answered: dict[str, list[Answer]] = {}  # the last run's answers: stable's host and each canary host

    def stop(self) -> None:
        self.stopped.set()

    def start(self, canary: list[str], stable: list[str]) -> "Job":
        """``run`` in a daemon thread (the chat-template probe happens here, before it returns)."""
        if self.chat is None:
            self.chat = has_chat_template(self.hosts[canary[0]], self.cfg)
        return Job(lambda: self.run(canary, stable))

    def _ask(self, name: str) -> list[Answer]:
        from deployctl.rollout.probes import host_url

        o = self.cfg.rollout.analysis.outputs
        by = {h.name: h for h in self.cfg.hosts}
        self.asked[name] = (t0 := time.monotonic(), out := [])
        answers = collect(host_url(self.cfg, by[name]), self.cfg.model.name, self.prompts, chat=bool(self.chat),
                          max_tokens=o.max_tokens, api_key=self.key, timeout=o.timeout_s,
                          should_stop=self.stopped.is_set, out=out)
        self.asked_took[name] = time.monotonic() - t0
        return answers

    def too_slow(self, canary: list[str], stable: list[str], factor: float, grace_s: float) -> Optional[str]:
        """Why a canary host is too slow to be worth waiting for, or None: once a stable host has answered every
        prompt (in S seconds, wall), a canary host still answering after factor × S + grace_s seconds of its own."""
        done = [n for n in stable if n in self.asked_took]
        if not done:
            return None
        s_name = done[0]
        s_took = self.asked_took[s_name]
        for n in canary:
            if n not in self.asked:
                continue
            start, ans = self.asked[n]
            took = time.monotonic() - start
            if len(ans) < len(self.prompts) and took > factor * s_took + grace_s:
                return (f"{n} answered {len(ans)} of {len(self.prompts)} golden prompts in {took:.0f} s, where stable "
                        f"({s_name}) answered all in {s_took:.1f} s: over {factor:g}× stable's time + {grace_s:g} s "
                        f"(rollout.analysis.max_p99_ttft_ratio / max_p99_tpot_ratio): too slow to serve")
        return None

    def _stable_answers(self, stable: list[str]) -> tuple[str, list[Answer]]:
        if self._stable is None or self._stable[0] not in stable:
            best = None
            for name in stable:  # the first stable host that answers
                ans = self._ask(name)
                if best is None or sum(not a.error for a in ans) > sum(not a.error for a in best[1]):
                    best = (name, ans)
                if all(not a.error for a in ans):
                    break
            self._stable = best
        return self._stable

    def run(self, canary: list[str], stable: list[str]) -> list[OutputReport]:
        """One report per canary host (pass, fail or inconclusive). Raises RemoteError (SSH trouble)."""
        if self.chat is None:
            self.chat = has_chat_template(self.hosts[canary[0]], self.cfg)
        if not stable:
            return []
        # stable's answers (asked once) while the canary hosts answer; daemon threads, so that a deploy that ends
        # (abort, promote by hand) never waits at exit for answers nobody reads
        jobs = [Job(lambda: self._stable_answers(stable))] + [Job(lambda n=n: self._ask(n)) for n in canary]
        for j in jobs:
            j.wait()
        s_name, s_ans = jobs[0].result()
        if self.stable_release and not self._rules:
            s_id = read_identity(self.hosts[s_name], self.stable_release)
            for n in canary:
                self._rules.setdefault(n, rules_for(self.cfg, s_id, read_identity(self.hosts[n], self.canary_release)))
        reports = []
        self.answered = {s_name: s_ans}
        for n, j in zip(canary, jobs[1:]):
            ans = j.value if j.error is None else [Answer(error=str(j.error))] * len(self.prompts)
            self.answered[n] = ans
            reports.append(compare(self.prompts, s_ans, ans, self._rules.get(n, Rules()), canary_host=n, stable_host=s_name))
        return reports


    def records(self, reports: list[OutputReport]) -> list:
        """The golden records (deployctl.rollout.goldenrecord) this run's answers make: stable's answers for the
        stable release, the first passing canary host's for the canary release (None entries dropped)."""
        from deployctl.rollout import goldenrecord

        o = self.cfg.rollout.analysis.outputs
        made = dict(prompts=self.prompts, chat=bool(self.chat), max_tokens=o.max_tokens)
        out = []
        if self._stable is not None and self.stable_release:
            s_name = self._stable[0]
            out.append(goldenrecord.make(self.stable_release, answers=self.answered.get(s_name, []),
                                         source=f"{s_name}, stable during the deploy of {self.canary_release}", **made))
        passed = next((r.canary_host for r in reports if r.result == "pass"), None)
        if passed:
            out.append(goldenrecord.make(self.canary_release, answers=self.answered.get(passed, []),
                                         source=f"{passed}, the canary at weight 0, agreeing with stable", **made))
        return [r for r in out if r is not None]


class Job:
    """A call running in a daemon thread (never keeps the process alive): ``done()``, ``result()`` (re-raises)."""

    def __init__(self, fn):
        self._done = threading.Event()
        self.value, self.error, self.reported = None, None, False

        def body():
            try:
                self.value = fn()
            except BaseException as e:  # handed to the caller by result()
                self.error = e
            finally:
                self._done.set()

        threading.Thread(target=body, daemon=True, name="golden-outputs").start()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self) -> None:
        self._done.wait()

    def result(self):
        if self.error is not None:
            raise self.error
        return self.value


def compare_urls(cfg: DeployConfig, canary_url: str, stable_url: str, *, chat: bool, mode: str = "exact") -> OutputReport:
    """The golden-output check between two base URLs (``http://host:port``, no /v1), as the analysis Job of
    ``render --target k8s-rollout`` runs it against the canary and stable Services: both answer the golden prompts
    (rollout.analysis.outputs), judged under agreement ``mode`` (exact, prefix, skip) with the thresholds of
    rollout.analysis.outputs. Returns the OutputReport (result pass, fail or inconclusive)."""
    from deployctl.service.http import api_key

    o = cfg.rollout.analysis.outputs
    prompts = load_prompts(o.prompts) if o.prompts else default_prompts()
    rules = Rules(mode, f"--mode {mode}", min_exact_share=o.min_exact_share, min_prefix_tokens=o.min_prefix_tokens,
                  min_prefix_share=o.min_prefix_share, max_repeats=o.max_repeats,
                  min_length_ratio=o.min_length_ratio, max_length_ratio=o.max_length_ratio)
    ask = dict(chat=chat, max_tokens=o.max_tokens, api_key=api_key(cfg), timeout=o.timeout_s)
    jobs = [Job(lambda u=u: collect(u, cfg.model.name, prompts, **ask)) for u in (stable_url, canary_url)]
    for j in jobs:
        j.wait()
    s_ans, c_ans = (j.value if j.error is None else [Answer(error=str(j.error))] * len(prompts) for j in jobs)
    return compare(prompts, s_ans, c_ans, rules, canary_host=canary_url, stable_host=stable_url)
