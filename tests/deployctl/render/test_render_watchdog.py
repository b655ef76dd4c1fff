"""Issue 39: the bundled runtime's unit has a systemd watchdog derived from server.engine_stall_timeout_s (default
120 s; 0 = off): Type=notify (the start completes at the runtime's READY=1, so the model load is bounded by
TimeoutStartSec, not by the watchdog), NotifyAccess=main (the runtime's main process sends WATCHDOG=1 from its engine
loop), WatchdogSec = the stall timeout + WATCHDOG_MARGIN_S; the runtime gets the same timeout in runtime.yaml when
it differs from its own default. Every unit passes the real `systemd-analyze verify`. Other engines send no
WATCHDOG=1 and get none; 0 renders the unit as before (Type=exec)."""
from __future__ import annotations

import yaml
import pytest

from deployctl.render import render_release
from deployctl.render.release import WATCHDOG_MARGIN_S
from deployctl.render.validate import verify_systemd
from support.render import make_config


def _files(cfg, tmp_path):
    out = {}
    for f in render_release(cfg, cfg.hosts[0], "r1", api_key=None):
        (tmp_path / f.path).write_text(f.content)
        out[f.path] = f.content
    return out


def _directives(unit: str) -> dict:
    return dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#"))


@pytest.mark.parametrize("stall, want", [(None, 120 + WATCHDOG_MARGIN_S), (45, 45 + WATCHDOG_MARGIN_S),
                                         (0.5, 1 + WATCHDOG_MARGIN_S), (0, None)])
def test_bundled_runtime_unit_has_a_watchdog_from_the_stall_timeout(tmp_path, stall, want):
    server = {"api_key_env": None, "bind": "127.0.0.1"} | ({} if stall is None else {"engine_stall_timeout_s": stall})
    cfg = make_config(server=server)
    files = _files(cfg, tmp_path)
    unit = _directives(files["chat-7b.service"])
    runtime = yaml.safe_load(files["runtime.yaml"])
    if want is None:
        assert unit["Type"] == "exec" and "WatchdogSec" not in unit and "NotifyAccess" not in unit
        assert runtime["engine_stall_timeout_s"] == 0
    else:
        assert (unit["Type"], unit["NotifyAccess"], unit["WatchdogSec"]) == ("notify", "main", str(want))
        # the runtime's own default is the same 120 s: a default deploy.yaml leaves runtime.yaml as it was
        assert runtime.get("engine_stall_timeout_s") == (None if stall is None else stall)
    assert unit["TimeoutStartSec"] == str(600 + 120)  # the load (and GPU wait) is the start's bound, not the watchdog's
    result = verify_systemd(tmp_path / "chat-7b.service")
    assert result.ok, result.output


@pytest.mark.parametrize("kind, version", [("vllm", "0.33.0"), ("sglang", "0.5.23")])
def test_other_engines_get_no_watchdog(tmp_path, kind, version):
    cfg = make_config(engine={"kind": kind, "version": version}, server={"api_key_env": None, "bind": "127.0.0.1"})
    unit = _directives(_files(cfg, tmp_path)["chat-7b.service"])
    assert unit["Type"] == "exec" and "WatchdogSec" not in unit and "NotifyAccess" not in unit


def test_a_stall_timeout_below_zero_is_refused(tmp_path):
    from deployctl.config import parse_config
    from deployctl.errors import ConfigError
    from support.render import config_dict

    with pytest.raises(ConfigError, match="engine_stall_timeout_s"):
        parse_config(yaml.safe_dump(config_dict(server={"engine_stall_timeout_s": -1})), "d.yaml")


def test_systemd_start_of_a_notify_unit_does_not_wait_for_the_model_load():
    """`systemctl restart` of a Type=notify unit blocks until READY=1 (the whole load); deployctl queues it
    (--no-block) and the readiness check waits, as for Type=exec. A unit still loading counts as running."""
    from deployctl.service.engine import Engine

    class Host:
        def __init__(self, cfg, state=""):
            self.config, self.calls, self.state = cfg.hosts[0], [], state

        def sudo(self, argv, timeout=60, check=True):
            self.calls.append(list(argv))
            return type("R", (), {"stdout": self.state, "exit_code": 0})()

        def run(self, cmd, timeout=15, check=True):
            return type("R", (), {"stdout": "0", "exit_code": 0})()

    cfg = make_config(engine={"device": "cpu"}, hosts=[{"name": "a", "address": "10.0.0.1", "launcher": "systemd",
                                                        "deploy_root": "/opt/x", "python": "/usr/bin/python3"}])
    h = Host(cfg)
    Engine(h, cfg).start()
    assert ["systemctl", "restart", "--no-block", "chat-7b.service"] in h.calls
    off = make_config(engine={"device": "cpu"}, server={"engine_stall_timeout_s": 0},
                      hosts=[{"name": "a", "address": "10.0.0.1", "launcher": "systemd", "deploy_root": "/opt/x",
                              "python": "/usr/bin/python3"}])
    h = Host(off)
    Engine(h, off).start()
    assert ["systemctl", "restart", "chat-7b.service"] in h.calls
    for state, running in (("ActiveState=activating\nSubState=start\n", True), ("ActiveState=active\nSubState=running\n", True),
                           ("ActiveState=activating\nSubState=auto-restart\n", False),
                           ("ActiveState=failed\nSubState=failed\n", False)):
        assert Engine(Host(cfg, state), cfg).running() is running, state
