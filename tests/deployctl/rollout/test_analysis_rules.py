"""The analysis rules on plain data (issue 15): golden-output agreement and degenerate checks, the agreement rule a
pair of releases gets, robust metric verdicts (NaN, counter reset, stable without traffic), probe verdicts, how
metrics and probes combine, and the inconclusive streak that pauses a rollout."""
from __future__ import annotations

import json

import pytest

from deployctl.errors import ConfigError
from deployctl.rollout.analysis import GroupStats, _p99, judge
from deployctl.rollout.golden import Answer, Prompt, default_prompts, load_prompts, parse_answer
from deployctl.rollout.goldencheck import Identity, parse_identity, rules_for
from deployctl.rollout.outputcheck import Rules, compare, repeated_run
from deployctl.rollout.probes import ProbeStats
from deployctl.rollout.verdicts import InconclusiveStreak, combine, judge_probes
from support.render import loopback_fleet

ANALYSIS = {"min_requests": 10, "max_error_rate": 0.05, "min_p99_delta_s": 0.01, "inconclusive_limit": 3}


@pytest.fixture
def cfg():
    return loopback_fleet(2, analysis=ANALYSIS)


VOCAB: dict[str, int] = {}


def ans(tokens, finish="length", ids=True):
    token_ids = [VOCAB.setdefault(t, len(VOCAB) + 1) for t in tokens] if ids else None
    return Answer(text="".join(tokens), tokens=list(tokens), token_ids=token_ids, finish_reason=finish,
                  completion_tokens=len(tokens), level="token")


PROMPTS = [Prompt(str(i), prompt=f"question {i}") for i in range(1, 5)]
HEALTHY = [ans(["The", " cat", " sat", " on", " the", " mat", f" {i}", "."], "stop") for i in range(4)]


def test_identical_answers_pass_and_one_differing_token_fails_showing_both_sides():
    rep = compare(PROMPTS, HEALTHY, [ans(a.tokens, "stop") for a in HEALTHY], Rules("exact", "same"))
    assert rep.result == "pass" and rep.identical == 4 and "outputs: 4/4 prompts identical" in rep.summary()
    drift = list(HEALTHY)
    drift[2] = ans(["The", " cat", " ran", " to", " the", " mat", " 2", "."], "stop")
    rep = compare(PROMPTS, HEALTHY, drift, Rules("exact", "same"))
    assert rep.result == "fail" and rep.identical == 3
    assert "3/4 prompts identical < min_exact_share 1" in rep.reason
    assert ("prompt 3 ('question 3'): first difference at token 2: stable ' sat' ' on' ' the' ' mat' | "
            "canary ' ran' ' to' ' the' ' mat'") in rep.reason
    assert rep.diffs == [{"prompt": "3", "label": "prompt 3 ('question 3')", "at": 2,
                          "stable": [" sat", " on", " the", " mat"], "canary": [" ran", " to", " the", " mat"]}]
    # a looser share or the prefix rule (another dtype) accepts the same drift
    assert compare(PROMPTS, HEALTHY, drift, Rules("exact", min_exact_share=0.75)).result == "pass"
    assert compare(PROMPTS, HEALTHY, drift, Rules("prefix", min_prefix_tokens=2, min_prefix_share=1.0)).result == "pass"
    assert compare(PROMPTS, HEALTHY, drift, Rules("prefix", min_prefix_tokens=3, min_prefix_share=1.0)).result == "fail"
    # weights changed on purpose: not compared
    assert compare(PROMPTS, HEALTHY, drift, Rules("skip", "weights changed")).result == "pass"


@pytest.mark.parametrize("canary, expect", [
    (ans([]), "canary answered empty text"),
    (ans(["la"] * 8, "length"), "canary repeats 'la' 8+ times from token 0"),
    (ans(["a", " b", "c", " b", "c", " b", "c", " b", "c", " b", "c", " b", "c", " b", "c", " b", "c"]),
     "canary repeats ' b' 'c' 8+ times from token 1"),
    (ans(["The", " \ufffd", " cat", " sat", " on", " the", " mat", "."], "stop"), "U+FFFD or invalid UTF-8"),
    (ans(["The", " cat", " sat", " on", " the", " mat", " 0", "."], "length"), "finish_reason length) where stable stopped"),
])
def test_degenerate_answers_fail_even_when_agreement_is_skipped(canary, expect):
    answers = list(HEALTHY)
    answers[0] = canary
    rep = compare(PROMPTS, HEALTHY, answers, Rules("skip", "weights changed"))
    assert rep.result == "fail" and expect in rep.reason, rep.reason
    assert rep.reason.startswith("prompt 1 ('question 1')")


def test_degenerate_checks_are_relative_to_stable_and_length_ratio_is_bounded():
    loop = [ans(["ha"] * 10) for _ in range(4)]
    assert compare(PROMPTS, loop, loop, Rules("skip")).result == "pass"  # stable loops too: the model, not a fault
    zero = Answer(text="x", tokens=["x"] * 6, token_ids=[0] * 6, finish_reason="length", completion_tokens=6, level="token")
    rep = compare(PROMPTS, HEALTHY, [zero] + HEALTHY[1:], Rules("skip"))
    assert rep.result == "fail" and "mostly token id 0" in rep.reason
    long = [ans(a.tokens * 3, "stop") for a in HEALTHY]
    rep = compare(PROMPTS, HEALTHY, long, Rules("skip", max_repeats=50))
    assert rep.result == "fail" and "mean output length ratio canary/stable 3.00 outside [0.5, 2]" in rep.reason
    assert repeated_run([1, 2, 3, 4], 2) is None and repeated_run([5, 1, 2, 1, 2], 2) == (1, 2)


def test_on_change_report_lets_changed_answers_by_but_never_degenerate_ones():
    """outputs.on_change report (deployctl.rollout.outputgate): a comparison that failed only its agreement rule is
    recorded as ``changed`` with its differences; one that also shows a degenerate sign still aborts."""
    from deployctl.rollout.outputgate import changed_note, history_outputs, only_changed

    drift = list(HEALTHY)
    drift[2] = ans(["The", " cat", " ran", " to", " the", " mat", " 2", "."], "stop")
    rep = compare(PROMPTS, HEALTHY, drift, Rules("exact", "same weights, engine and dtype; no file changed"))
    assert rep.result == "fail" and rep.changed and only_changed(rep)
    looping = list(drift)
    looping[0] = ans(["la"] * 8, "length")
    bad = compare(PROMPTS, HEALTHY, looping, Rules("exact", "same"))
    assert bad.result == "fail" and bad.changed and not only_changed(bad), bad.problems
    assert not only_changed(compare(PROMPTS, HEALTHY, [ans([])] + HEALTHY[1:], Rules("skip")))
    rep.result = "changed"
    vj = {"kind": "outputs", "weight": 0, **rep.to_json()}
    assert rep.summary().endswith("; CHANGED: " + rep.reason)
    kept = history_outputs([vj, {"kind": "window"}])
    assert len(kept) == 1 and kept[0]["result"] == "changed" and kept[0]["diffs"][0]["at"] == 2
    assert kept[0]["why"] == "same weights, engine and dtype; no file changed"
    assert changed_note([vj]) == ("outputs changed at 0% on canary (outputs.on_change report; 1 comparison(s)): "
                                  f"{rep.reason} (exact: same weights, engine and dtype; no file changed)")


def test_canary_errors_fail_and_a_silent_stable_is_inconclusive():
    down = [Answer(error="ConnectError: refused")] * 4
    rep = compare(PROMPTS, HEALTHY, down, Rules())
    assert rep.result == "fail" and "the canary did not answer (ConnectError: refused)" in rep.reason
    rep = compare(PROMPTS, down, HEALTHY, Rules())
    assert rep.result == "inconclusive" and "stable (stable) answered none of the 4 prompts" in rep.reason


def test_agreement_rule_from_the_two_releases(cfg):
    same = Identity("w1", "deployctl_runtime", "float32")
    assert rules_for(cfg, same, same).mode == "exact"
    r = rules_for(cfg, same, Identity("w1", "deployctl_runtime", "bfloat16"))
    assert r.mode == "prefix" and "dtype float32 → bfloat16" in r.why
    r = rules_for(cfg, same, Identity("w2", "deployctl_runtime", "float32"))
    assert r.mode == "exact" and "weights changed w1 → w2, outputs.on_model_change check" in r.why
    skip = loopback_fleet(2, analysis={**ANALYSIS, "outputs": {"on_model_change": "skip"}})
    assert rules_for(skip, same, Identity("w2", "deployctl_runtime", "float32")).mode == "skip"
    assert rules_for(skip, same, same).mode == "exact"  # skip excuses a weights change only
    manifest = "aa  model.safetensors\nbb  tokenizer_config.json\n"
    ident = parse_identity(json.dumps({"runtime_wheel": "deployctl_runtime-0.1.0-py3-none-any.whl"}), manifest,
                           "model: /m\ndtype: 'float32'\n")
    assert ident.engine == "deployctl-runtime" and ident.dtype == "float32"
    # release.json's engine_kind names the engine: a switch to transformers is an engine change (prefix rule)
    foreign = parse_identity(json.dumps({"runtime_wheel": "deployctl_runtime-0.1.0-py3-none-any.whl",
                                         "engine_kind": "transformers"}), manifest, "dtype: float32\n")
    assert foreign.engine == "transformers" and rules_for(cfg, ident, foreign).mode == "prefix"
    # a chat template change is not a weights change
    assert parse_identity("{}", manifest.replace("bb", "cc"), "").weights == ident.weights
    assert parse_identity("{}", manifest.replace("aa", "ab"), "").weights != ident.weights


def test_prompt_file_and_answer_parsing(tmp_path):
    assert len(default_prompts()) == 16
    f = tmp_path / "p.jsonl"
    f.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n\n{"id": "x", "prompt": "once"}\n')
    ps = load_prompts(f)
    assert [p.id for p in ps] == ["1", "x"] and ps[0].as_text() == "hi" and ps[1].as_messages()[0]["content"] == "once"
    f.write_text('{"prompt": 3}\n')
    with pytest.raises(ConfigError, match=r"p.jsonl:1: not a golden prompt line: prompt must be a string"):
        load_prompts(f)
    chat = {"choices": [{"message": {"content": "Hi there"}, "finish_reason": "stop", "token_ids": [5, 6],
                         "logprobs": {"content": [{"token": "Hi"}, {"token": " there"}]}}],
            "usage": {"completion_tokens": 2}}
    a = parse_answer(chat, chat=True)
    assert (a.tokens, a.token_ids, a.level, a.completion_tokens) == (["Hi", " there"], [5, 6], "token", 2)
    plain = parse_answer({"choices": [{"text": "one two", "finish_reason": "length"}]}, chat=False)
    assert plain.tokens == ["one", " two"] and plain.level == "text" and plain.token_ids is None


def _samples(count, bucket_01):
    from deployctl.promhist import parse_text

    name = "deployctl_runtime_time_to_first_token_seconds"
    return parse_text(f'{name}_bucket{{le="0.1"}} {bucket_01}\n{name}_bucket{{le="+Inf"}} {count}\n'
                      f"{name}_sum 1.0\n{name}_count {count}\n")


def test_nan_counter_reset_and_idle_stable_are_inconclusive_with_their_reason(cfg):
    name = "deployctl_runtime_time_to_first_token_seconds"
    g = GroupStats(["a"])
    before, after = {"a": _samples(10, 5)}, {"a": _samples(4, 2)}  # went down with the same process
    assert _p99(before, after, ["a"], name, g) == (None, 0) and g.reset == ["a"]
    v = judge(cfg, GroupStats(["a"], requests=30, generations=30, reset=["a"]), GroupStats(["b"], requests=30, generations=30), 5.0)
    assert v.result == "inconclusive" and "counter reset (histogram went down) on a" in v.reason
    g = GroupStats(["b"])
    assert _p99({"b": _samples(1, 1)}, {"b": _samples("NaN", 1)}, ["b"], name, g)[0] is None and g.nan == ["b"]
    v = judge(cfg, GroupStats(["a"], requests=30, generations=30), GroupStats(["b"], requests=30, generations=30, nan=["b"]), 5.0)
    assert v.result == "inconclusive" and "NaN in the latency histogram of b" in v.reason
    busy = GroupStats(["a"], requests=30, generations=30, p99_ttft_s=0.1, p99_tpot_s=0.01, ttft_count=30)
    v = judge(cfg, busy, GroupStats(["b"]), 5.0)
    assert v.result == "inconclusive" and "stable served 0 requests" in v.reason
    assert judge(cfg, busy, GroupStats(["b"]), 5.0, baseline=busy).result == "pass"  # an earlier window's baseline
    assert "inconclusive [metrics]" in v.summary() and "over 30 TTFT samples" in v.summary()
    # at 100% stable's histograms hold only the probes on an idle server: the loaded canary is judged against the
    # baseline from a window where stable served users, not against that
    idle = GroupStats(["b"], requests=0, generations=0, p99_ttft_s=0.02, p99_tpot_s=0.002, ttft_count=4)
    assert judge(cfg, busy, idle, 5.0, baseline=busy).result == "pass"
    assert judge(cfg, busy, idle, 5.0).result == "inconclusive"


def test_verdict_line_says_what_each_count_counts(cfg):
    """C33 (issue 21): the demo's line said "53 req" and "2 latency samples" side by side without saying why they
    differ: the requests are the router's access-log lines (every route), the samples the TTFT histogram's
    observations (generations only). Each number carries its own label, on each side."""
    canary = GroupStats(["a"], requests=53, generations=53, errors=1, p99_ttft_s=0.012, p99_tpot_s=0.003, ttft_count=2)
    stable = GroupStats(["b"], requests=900, generations=900, p99_ttft_s=0.01, p99_tpot_s=0.002, ttft_count=41)
    v = judge(cfg, canary, stable, 5.0)
    line = v.summary()
    assert v.result == "inconclusive" and "2 canary latency samples < min_latency_samples" in v.reason
    assert ("canary 53 req via router (all routes; 53 generations), 1 errors (1.9%), P99 TTFT 12.0 ms, P99 TPOT "
            "3.0 ms over 2 TTFT samples (generations, probes incl.)") in line
    assert "stable 900 req via router (all routes; 900 generations), 0 errors (0.0%)" in line
    assert "over 41 TTFT samples (generations, probes incl.)" in line


def probes(samples, errors=0, ttft=0.02, tpot=0.005, failing=()):
    return ProbeStats(["x"], sent=samples + errors, errors=errors, ttft_s=ttft if samples else None,
                      tpot_s=tpot if samples else None, samples=samples, error_detail="x: timeout" if errors else "",
                      failing=list(failing))


def test_probe_verdicts_and_how_they_combine_with_metrics(cfg):
    a = cfg.rollout.analysis
    ok = probes(4)
    assert judge_probes(a, ok, ok) == ("pass", "")
    res, why = judge_probes(a, probes(4, tpot=0.4), ok)
    assert res == "fail" and "canary probe median TPOT 400.0 ms is 80.0× stable 5.0 ms" in why
    res, why = judge_probes(a, probes(0, errors=4, failing=["a"]), ok)
    assert res == "fail" and "canary a does not answer probes (4/4 failed: x: timeout)" in why
    res, why = judge_probes(a, probes(0, errors=4, failing=["a"]), probes(0, errors=4, failing=["b"]))
    assert res == "inconclusive" and "probes reach neither canary nor stable" in why
    res, why = judge_probes(a, probes(2), ok)
    assert res == "inconclusive" and "probe samples canary 2, stable 4 < min_samples 3" in why
    # with real traffic the two sides carry different loads: probes judge liveness and errors, not latency
    assert judge_probes(a, probes(4, tpot=0.4), ok, latency=False) == ("pass", "")
    assert judge_probes(a, probes(0, errors=4, failing=["a"]), ok, latency=False)[0] == "fail"

    quiet = judge(cfg, GroupStats(["a"], requests=0, generations=0), GroupStats(["b"], requests=0, generations=0), 5.0)
    assert quiet.result == "inconclusive"
    v = combine(quiet, ("pass", "", {"canary": {}, "stable": {}}))
    assert (v.result, v.source) == ("pass", "probes") and "judged on probes (0 canary requests < min_requests 10)" in v.reason
    slow = combine(judge(cfg, GroupStats(["a"]), GroupStats(["b"]), 5.0), ("fail", "canary probe median TPOT …", {}))
    assert (slow.result, slow.source) == ("fail", "probes")
    nan = judge(cfg, GroupStats(["a"], requests=30, generations=30), GroupStats(["b"], requests=30, generations=30, nan=["b"]), 5.0)
    assert combine(nan, ("pass", "", {})).result == "inconclusive"  # probes do not paper over broken metrics
    healthy = judge(cfg, GroupStats(["a"], requests=30, generations=30, ttft_count=30, p99_ttft_s=0.1, p99_tpot_s=0.01),
                    GroupStats(["b"], requests=30, generations=30, ttft_count=30, p99_ttft_s=0.1, p99_tpot_s=0.01), 5.0)
    assert combine(healthy, ("pass", "", None)).source == "metrics+probes"


def test_inconclusive_windows_in_a_row_pause(cfg):
    s = InconclusiveStreak(cfg.rollout.analysis.inconclusive_limit)
    assert [s.add(r) for r in ("inconclusive", "inconclusive", "pass", "inconclusive", "inconclusive")] == [False] * 5
    assert s.add("inconclusive") and s.count == 3
    assert not any(InconclusiveStreak(0).add("inconclusive") for _ in range(10))  # 0: never pause


def test_release_json_model_files_name_what_changed(cfg):
    """release.json's model_files (sha256 of tokenizer.json, tokenizer_config.json, generation_config.json,
    config.json): the output check's rule says which changed beside unchanged weights; a release without them says
    nothing (not 'unchanged')."""
    base = {"tokenizer.json": "1" * 64, "tokenizer_config.json": "2" * 64, "generation_config.json": "3" * 64,
            "config.json": "4" * 64}
    manifest = "aa  model.safetensors\n"

    def ident(files):
        rel = {"runtime_wheel": "deployctl_runtime-0.1.0-py3-none-any.whl", **({"model_files": files} if files else {})}
        return parse_identity(json.dumps(rel), manifest, "dtype: float32\n")

    old = ident(base)
    # outputs that differ with every file the same point at the engine or the runtime, not the model: said so
    assert rules_for(cfg, old, ident(dict(base))).why == "same weights, engine and dtype; no file changed"
    r = rules_for(cfg, old, ident({**base, "tokenizer_config.json": "9" * 64}))
    assert r.mode == "exact" and r.why == "same weights, engine and dtype; changed: tokenizer_config.json (chat template)"
    r = rules_for(cfg, old, ident({**base, "generation_config.json": "8" * 64, "config.json": "7" * 64}))
    assert r.why.endswith("changed: config.json (model config), generation_config.json (generation defaults)"), r.why
    gone = dict(base)
    del gone["tokenizer.json"]
    assert "changed: tokenizer.json (tokenizer)" in rules_for(cfg, old, ident(gone)).why
    assert rules_for(cfg, ident(None), old).why == "same weights, engine and dtype"  # an old release: unknown


def test_read_model_files_hashes_what_the_model_dir_holds(tmp_path):
    import hashlib

    from deployctl.config import HostConfig
    from deployctl.hosts import Host
    from deployctl.rollout.release import read_model_files
    from support.render import make_config

    (tmp_path / "tokenizer_config.json").write_text('{"chat_template": "x"}')
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"w")
    cfg = make_config(model={"path": str(tmp_path)})
    host = Host.from_config(HostConfig(name="here", address="local", deploy_root=str(tmp_path / "root")))
    got = read_model_files(host, cfg)
    assert got == {"tokenizer_config.json": hashlib.sha256(b'{"chat_template": "x"}').hexdigest(),
                   "config.json": hashlib.sha256(b"{}").hexdigest()}


def test_analysis_reads_the_access_log_nginx_writes_when_router_access_log_is_unset(tmp_path):
    """router.access_log unset: nginx logs to /var/log/nginx/<service>.access.json (render), and the analysis read
    nothing there, so with rollout.analysis.min_client_requests every window of a real canary was inconclusive."""
    import os
    import re
    import uuid

    from deployctl.config import HostConfig
    from deployctl.hosts import Host
    from deployctl.render import render_nginx
    from deployctl.rollout.router import Router
    from support.render import make_config

    name = "t" + uuid.uuid4().hex[:12]
    cfg = make_config(service={"name": name}, router={"host": "local", "upstream_conf": str(tmp_path / "up.conf"),
                                                      "access_log": None})
    assert cfg.router.access_log is None
    conf = render_nginx(cfg, stable=list(cfg.hosts), canary=[], canary_weight=0)
    path = re.search(r"access_log (\S+) ", conf).group(1)
    assert path == f"/var/log/nginx/{name}.access.json"
    if not os.access(os.path.dirname(path), os.W_OK):
        pytest.skip(f"{os.path.dirname(path)} is not writable here")
    router = Router(cfg, Host.from_config(HostConfig(name="router", address="local", deploy_root=str(tmp_path))))
    try:
        with open(path, "w") as f:
            f.write('{"status":200}\n')
        start = router.access_log_size()
        assert start == len('{"status":200}\n')
        with open(path, "a") as f:
            f.write('{"status":502}\n{"status":200}\n{"part')
        text, offset = router.access_log_since(start)
        assert text == '{"status":502}\n{"status":200}\n' and offset == start + len(text)  # whole lines only
    finally:
        os.unlink(path)
