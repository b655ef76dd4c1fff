"""The runbook format: every shipped runbook loads; bad files fail with FILE:LINE: problem; `runbook list` shows
the good ones and exits 3 for a bad one; `show` renders readable text; expectations compare as documented."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deployctl.errors import ConfigError
from deployctl.resources import runbooks_dir
from deployctl.runbook.expect import Expect
from deployctl.runbook.library import load_library
from deployctl.runbook.model import parse_runbook
from support.paths import REPO
from support.runbook_fleet import cli

SHIPPED = sorted(p.stem for p in runbooks_dir().glob("*.yaml"))
GOOD = """\
title: t
when: [x]
steps:
  - id: a
    title: A
    check: {http: {path: /readyz}}
    expect: "== 200"
    on_fail: {action: restart}
"""


def test_at_least_ten_shipped_runbooks_load():
    lib = load_library([runbooks_dir()])
    assert lib.errors == []
    assert len(lib.runbooks) >= 10 and sorted(lib.runbooks) == SHIPPED
    for rb in lib.runbooks.values():
        assert rb.when and rb.steps


def _err(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_runbook(text, "rb.yaml", "rb")
    assert info.value.exit_code == 3
    return str(info.value)


@pytest.mark.parametrize("old,new,expected", [
    ("check: {http: {path: /readyz}}", "check: {htp: {path: /readyz}}", "rb.yaml:6: unknown key 'steps.0.check.htp'"),
    ("check: {http: {path: /readyz}}", "check: {}", "rb.yaml:6: steps.0.check: a check has exactly one kind"),
    ('expect: "== 200"', 'expect: "about 200"', "rb.yaml:7: steps.0.expect: expect 'about 200' is not a condition"),
    ("{action: restart}", "{action: reboot}", "rb.yaml:8: steps.0.on_fail.action: Input should be"),
    ("{action: restart}", "{action: escalate}", "rb.yaml:8: steps.0.on_fail: action escalate needs a message"),
    ("{action: restart}", "nowhere", "rb.yaml:8: on_fail 'nowhere' is not next, stop or a step id (a)"),
    ("{action: restart}", "{action: escalate, message: 'see {obs.b}'}", "rb.yaml:8: {obs.b} names no step"),
    ("{action: restart}", "{action: escalate, message: 'port {prot}'}", "rb.yaml:8: unknown variable {prot}"),
    ("check: {http: {path: /readyz}}", "check: {preflight: {name: gpu}}", "rb.yaml:6: steps.0.check.preflight.name: no preflight check named 'gpu'"),
    ("title: t\n", "", "rb.yaml:1: title is required"),
])
def test_errors_name_file_line_and_problem(old, new, expected):
    text = GOOD.replace(old, new, 1)
    assert text != GOOD
    assert expected in _err(text)


def test_duplicate_step_ids_and_syntax_errors():
    step = GOOD.split("steps:\n", 1)[1]
    assert "rb.yaml:9: step id 'a' is used twice" in _err(GOOD + step)
    err = _err("title: [\n")
    assert err.startswith("rb.yaml:2:") and "YAML syntax error" in err
    assert "duplicate key 'title' on lines 1 and 2" in _err("title: a\ntitle: b\n")


def test_list_reports_bad_file_with_line_and_still_lists_the_others(tmp_path):
    extra = tmp_path / "mine"
    extra.mkdir()
    (extra / "broken.yaml").write_text(GOOD.replace('expect: "== 200"', 'expect: "=> 200"'))
    shutil.copy(runbooks_dir() / "connection-resets.yaml", extra / "my-resets.yaml")
    r = cli("runbook", "list", env={"DEPLOYCTL_RUNBOOKS_PATH": str(extra)})
    assert r.returncode == 3
    assert f"{extra / 'broken.yaml'}:7: steps.0.expect: expect '=> 200' is not a condition" in r.stderr.replace("\n", "")
    for name in SHIPPED + ["my-resets"]:
        assert name in r.stdout
    assert "broken" not in r.stdout
    # the broken one cannot run; the others can still be shown
    r = cli("runbook", "run", "broken", "-c", str(tmp_path / "none.yaml"), env={"DEPLOYCTL_RUNBOOKS_PATH": str(extra)})
    assert r.returncode == 3 and "broken.yaml:7" in r.stderr
    r = cli("runbook", "show", "my-resets", env={"DEPLOYCTL_RUNBOOKS_PATH": str(extra)})
    assert r.returncode == 0


def test_list_clean_and_unknown_name():
    r = cli("runbook", "list", "--json")
    assert r.returncode == 0, r.stderr
    import json

    doc = json.loads(r.stdout)
    assert doc["errors"] == [] and [x["name"] for x in doc["runbooks"]] == SHIPPED
    r = cli("runbook", "show", "service-wont-strat")
    assert r.returncode == 2 and "did you mean 'service-wont-start'" in r.stderr


def test_show_is_readable_text():
    r = cli("runbook", "show", "service-wont-start")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith("Service won't start\n")
    assert "Use when:" in out and "Steps:" in out
    order = [out.index(f"[{s}]") for s in ("logs", "config", "model_files", "port", "vram", "dependencies", "start")]
    assert order == sorted(order)  # the order: logs, config, model files, port, VRAM, dependencies
    assert "free server.port (stop the process holding it) (asks first); then the next step" in out
    assert "escalate: model files in {model_path}" in out


@pytest.mark.parametrize("cond,value,holds", [
    ("== 200", 200, True), ("== 200", "200", True), ("== 200", 0, False), ("!= 0", 3, True),
    ("< 0.9", 0.5, True), ("< 0.9", None, False), (">= 1", 1, True), ("<= 0", 0.0, True),
    ("in [free, runtime]", "runtime", True), ("in [free, runtime]", "other", False),
    ("not in [fail]", "warn", True), ("matches ^ok", "ok now", True), ("is true", True, True),
    ("is true", "true", False), ("is false", False, True), ("is none", None, True), ("is not none", 0, True),
    ("== free", "free", True),
])
def test_expectations(cond, value, holds):
    assert Expect.parse(cond).holds(value) is holds


def test_expectation_with_variable():
    assert Expect.parse("< {x}").holds(0.5, lambda s: s.replace("{x}", "0.85"))
    assert not Expect.parse(">= {x}").holds(2, lambda s: s.replace("{x}", "4"))


# -- regressions (from test_runbook_edge_cases.py): Invalid runbook files given through DEPLOYCTL_RUNBOOKS_PATH, through the real CLI: one line naming the file, exit 3, never a traceback; the good runbooks still list.

def runbook(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DEPLOYCTL_RUNBOOKS_PATH": str(tmp_path / "rb"),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "deployctl", "runbook", *args], env=env, capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)


def write(tmp_path: Path, name: str, data: bytes | str) -> Path:
    (tmp_path / "rb").mkdir(exist_ok=True)
    path = tmp_path / "rb" / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def config_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 3, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_non_utf8_runbook_is_a_config_error_and_the_others_still_list(tmp_path):
    # read_text() raised UnicodeDecodeError out of load_library: `runbook list` (and show/run of any runbook) crashed
    bad = write(tmp_path, "latin.yaml", b"title: Caf\xe9 down\nwhen: [x]\nsteps: []\n")
    config_error(runbook(tmp_path, "show", "latin"), str(bad), "UTF-8")
    proc = runbook(tmp_path, "list", "--json")
    config_error(proc, str(bad))
    import json

    names = {r["name"] for r in json.loads(proc.stdout)["runbooks"]}
    assert "connection-resets" in names


CYCLE = """title: Cycle
when: [never]
steps:
  - id: a
    title: A
    check: {{command: {{run: "echo a >> {counter}"}}}}
    expect: "== 0"
    on_pass: b
  - id: b
    title: B
    check: {{command: {{run: "echo b >> {counter}"}}}}
    expect: "== 0"
    on_pass: a
"""


PROCESS_STEP = "when: [never]\nsteps:\n  - id: a\n    title: A\n    check: {process: {}}\n    expect: is true\n"


def local_deploy_yaml(tmp_path: Path) -> Path:
    """A deploy.yaml with one ``address: local`` host under tmp_path/root."""
    path = tmp_path / "deploy.yaml"
    path.write_text("service: {name: svc}\nmodel: {path: /nonexistent/model}\nengine: {device: cpu}\n"
                    f"hosts:\n  - {{name: h1, address: local, deploy_root: {tmp_path / 'root'}, launcher: process}}\n")
    return path


def test_a_cycle_of_step_branches_is_refused_before_anything_runs(tmp_path):
    # b -> a -> b ... ran each check 50 times (MAX_STEPS_PER_HOST = 100), then reported the host "healthy", exit 0;
    # with an action in the loop it would act 50 times
    counter = tmp_path / "counter"
    path = write(tmp_path, "cycle.yaml", CYCLE.format(counter=counter))
    config_error(runbook(tmp_path, "show", "cycle"), str(path), "on_pass", "'a'")
    local_deploy_yaml(tmp_path)
    config_error(runbook(tmp_path, "run", "cycle", "--yes", "-c", str(tmp_path / "deploy.yaml")), str(path))
    assert not counter.exists()


def test_a_step_branching_to_itself_is_refused(tmp_path):
    path = write(tmp_path, "self.yaml", "title: Self\n" + PROCESS_STEP + "    on_fail: {action: restart, verify: false, then: a}\n")
    config_error(runbook(tmp_path, "show", "self"), str(path), "on_fail.then", "'a'")


def test_a_repeated_host_is_run_once(tmp_path):
    # `--host h1 --host h1` ran the whole runbook twice on h1 (with --yes, every action twice)
    counter = tmp_path / "counter"
    once = CYCLE.format(counter=counter).replace("title: Cycle", "title: Once").split("    on_pass: b\n")[0]
    write(tmp_path, "once.yaml", once)  # the cycle's first step alone
    local_deploy_yaml(tmp_path)
    proc = runbook(tmp_path, "run", "once", "--host", "h1", "--host", "h1", "--json", "-c", str(tmp_path / "deploy.yaml"))
    assert proc.returncode == 0, proc.stderr
    import json

    assert [h["host"] for h in json.loads(proc.stdout)["hosts"]] == ["h1"]
    assert counter.read_text() == "a\n"


def test_a_bad_regex_in_expect_is_a_config_error_naming_the_file(tmp_path):
    # re.compile's re.error is no ValueError: it escaped pydantic and load_library, so `runbook show` of ANY runbook
    # (and list, and run) crashed with a traceback
    bad = write(tmp_path, "regex.yaml", """title: Regex
when: [never]
steps:
  - id: a
    title: A
    check: {command: {run: "true"}}
    expect: "matches ([unclosed"
""")
    config_error(runbook(tmp_path, "show", "regex"), str(bad), "matches ([unclosed")
    proc = runbook(tmp_path, "show", "connection-resets")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr


def test_an_infinite_timeout_is_a_config_error(tmp_path):
    # `timeout_s: .inf` with `wait: true` polled a failing check for ever (and window_s: .inf slept for ever)
    bad = write(tmp_path, "forever.yaml", "title: Forever\n" + PROCESS_STEP + "    timeout_s: .inf\n    wait: true\n")
    config_error(runbook(tmp_path, "show", "forever"), str(bad), "timeout_s")


METRIC_STEP = """title: t
when: [always]
steps:
  - id: a
    title: tail
    check: {metric: {name: e2e, stat: tail_ratio, q: 0.99, min_samples: 10}}
    expect: "< 10"
"""


def test_a_statistic_needs_enough_samples_and_min_samples_only_raises_it():
    from deployctl.promhist import min_samples_for_quantile

    # P99 needs 100 observations for one to lie above it; below the median the rule mirrors
    assert [min_samples_for_quantile(q) for q in (0.99, 0.95, 0.9, 0.5, 0.999, 0.1)] == [100, 20, 10, 2, 1000, 10]
    err = _err(METRIC_STEP)
    assert "rb.yaml:6:" in err and "min_samples 10 is below what P99 needs (100" in err
    step = parse_runbook(METRIC_STEP.replace("min_samples: 10", "min_samples: 500"), "rb.yaml", "rb").steps[0]
    assert step.check.metric.samples_needed == 500
    step = parse_runbook(METRIC_STEP.replace(", min_samples: 10", ""), "rb.yaml", "rb").steps[0]
    assert step.check.metric.samples_needed == 100
    mean = parse_runbook(METRIC_STEP.replace("stat: tail_ratio, q: 0.99, min_samples: 10", "stat: mean"),
                         "rb.yaml", "rb").steps[0]
    assert mean.check.metric.samples_needed == 1
    err = _err(METRIC_STEP.replace("stat: tail_ratio, q: 0.99", "stat: value"))
    assert "min_samples applies to quantile, tail_ratio and mean, not stat value" in err
