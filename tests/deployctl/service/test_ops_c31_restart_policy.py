"""C31: configuration errors are not restarted in a loop. The runtime's real exit code for an invalid runtime.yaml
is what the rendered unit's RestartPreventExitStatus names and what launch.sh refuses to restart; a deploy-style
start (launcher.start, then the readiness wait) reports the exit code and the runtime's own message after one try.
A crash restarting with backoff: test_render_launcher.py. A failed unit is reset before every systemd start."""
from __future__ import annotations

import subprocess
import sys

import pytest

from deployctl.config import HostConfig
from deployctl.errors import HealthError
from deployctl.hosts import Host
from deployctl.render import render_release
from deployctl.service.engine import Engine
from support.render import local_release, make_config

BAD_YAML = "model: /nowhere\nmax_num_seqs: -3\nno_such_setting: 1\n"


def _runtime_exit_code(tmp_path) -> int:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD_YAML)
    r = subprocess.run([sys.executable, "-m", "deployctl_runtime", "serve", "--config", str(bad)],
                       capture_output=True, text=True, timeout=120)
    assert "deployctl-runtime serve:" in r.stderr, r.stderr
    return r.returncode


def _unit_values(text: str, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(key + "=")]


def test_unit_prevents_restarting_the_runtimes_config_error(tmp_path):
    code = _runtime_exit_code(tmp_path)
    assert code not in (0, 1)  # distinct from a clean drain and a failed start (those are restarted)
    cfg = make_config(engine={"device": "cpu"})
    unit = next(f for f in render_release(cfg, cfg.hosts[0], "r1", api_key=None) if f.path.endswith(".service"))
    assert _unit_values(unit.content, "Restart") == ["on-failure"]
    assert _unit_values(unit.content, "RestartPreventExitStatus") == [str(code)]
    assert int(_unit_values(unit.content, "RestartSec")[0]) >= 3


@pytest.fixture
def bad_release(tmp_path):
    root = tmp_path / "root"
    cfg, rel = local_release(root, sys.executable, api_key=None)
    (rel / "runtime.yaml").write_text(BAD_YAML)  # the release's runtime.yaml is invalid
    (root / "current").symlink_to("releases/r1")
    host = Host.from_config(HostConfig(name="h", address="local", deploy_root=str(root), launcher="process",
                                       python=sys.executable))
    yield cfg, host, root
    Engine(host, cfg).stop(timeout=5)
    host.close()


def test_config_error_stops_after_one_try_with_exit_code_and_log_tail(bad_release, monkeypatch):
    cfg, host, root = bad_release
    monkeypatch.setenv("DEPLOYCTL_LAUNCH_BACKOFF_S", "0.1")  # a restart, if any, would come at once
    offset = Engine(host, cfg).start()
    with pytest.raises(HealthError) as err:
        Engine(host, cfg).wait_ready(timeout=60, log_offset=offset)
    msg = str(err.value)
    assert msg.startswith("h: the runtime exited while starting") and "h: h:" not in msg
    assert "exited with 2 (configuration error); not restarting" in msg  # the exit code, and why no restart
    assert "deployctl-runtime serve:" in msg  # the runtime's own line from the log tail
    log = (root / "shared" / "logs" / "runtime.log").read_text()
    assert log.count("starting runtime:") == 1 and "restart 1/" not in log
    assert not Engine(host, cfg).running()


class _Recorder:
    """Stands in for a systemd host's sudo: records the argv of each call (no systemd in the test machine)."""

    def __init__(self):
        self.calls, self.config = [], HostConfig(name="s", address="x", deploy_root="/opt/x", launcher="systemd")

    def sudo(self, argv, timeout=60, check=True):
        self.calls.append(list(argv))

    def run(self, cmd, timeout=15, check=True):
        return type("R", (), {"stdout": "0", "exit_code": 0})()


def test_systemd_start_clears_a_failed_state_first():
    h = _Recorder()
    Engine(h, make_config(engine={"device": "cpu"})).start()
    verbs = [c[1] for c in h.calls if c[0] == "systemctl"]
    # the log cap's timer is enabled beside the unit (deploy.yaml logs:); reset-failed comes before the restart
    assert verbs == ["daemon-reload", "enable", "reset-failed", "restart"]
    assert ["systemctl", "enable", "--now", "chat-7b-logs.timer"] in h.calls
    installed = [c[-1] for c in h.calls if c[0] == "install"]
    assert installed == [f"/etc/systemd/system/chat-7b{s}" for s in (".service", "-logs.service", "-logs.timer")]
