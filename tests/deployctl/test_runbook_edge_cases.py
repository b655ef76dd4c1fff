"""Invalid runbook files given through DEPLOYCTL_RUNBOOKS_PATH, through the real CLI: one line naming the file,
exit 3, never a traceback; the good runbooks still list."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


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


def test_a_cycle_of_step_branches_is_refused_before_anything_runs(tmp_path):
    # b -> a -> b ... ran each check 50 times (MAX_STEPS_PER_HOST = 100), then reported the host "healthy", exit 0;
    # with an action in the loop it would act 50 times
    counter = tmp_path / "counter"
    path = write(tmp_path, "cycle.yaml", CYCLE.format(counter=counter))
    config_error(runbook(tmp_path, "show", "cycle"), str(path), "on_pass", "'a'")
    (tmp_path / "deploy.yaml").write_text(
        "service: {name: svc}\nmodel: {path: /nonexistent/model}\nengine: {device: cpu}\n"
        f"hosts:\n  - {{name: h1, address: local, deploy_root: {tmp_path / 'root'}, launcher: process}}\n")
    config_error(runbook(tmp_path, "run", "cycle", "--yes", "-c", str(tmp_path / "deploy.yaml")), str(path))
    assert not counter.exists()


def test_a_step_branching_to_itself_is_refused(tmp_path):
    path = write(tmp_path, "self.yaml", """title: Self
when: [never]
steps:
  - id: a
    title: A
    check: {process: {}}
    expect: is true
    on_fail: {action: restart, verify: false, then: a}
""")
    config_error(runbook(tmp_path, "show", "self"), str(path), "on_fail.then", "'a'")


def test_a_repeated_host_is_run_once(tmp_path):
    # `--host h1 --host h1` ran the whole runbook twice on h1 (with --yes, every action twice)
    counter = tmp_path / "counter"
    write(tmp_path, "once.yaml", f"""title: Once
when: [never]
steps:
  - id: a
    title: A
    check: {{command: {{run: "echo a >> {counter}"}}}}
    expect: "== 0"
""")
    (tmp_path / "deploy.yaml").write_text(
        "service: {name: svc}\nmodel: {path: /nonexistent/model}\nengine: {device: cpu}\n"
        f"hosts:\n  - {{name: h1, address: local, deploy_root: {tmp_path / 'root'}, launcher: process}}\n")
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
    bad = write(tmp_path, "forever.yaml", """title: Forever
when: [never]
steps:
  - id: a
    title: A
    check: {process: {}}
    expect: is true
    timeout_s: .inf
    wait: true
""")
    config_error(runbook(tmp_path, "show", "forever"), str(bad), "timeout_s")
