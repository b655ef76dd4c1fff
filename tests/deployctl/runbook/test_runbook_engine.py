"""The runbook engine end to end over real sshd: healthy → nothing changes; a fault → a "no" changes nothing,
--dry-run only shows, --yes fixes; every run leaves audit records on the host. The service is a stand-in
(http.server serving /healthz and /readyz) started by the runbook's own start action through the Host layer."""
from __future__ import annotations

from pathlib import Path

import pytest

from support.runbook_fleet import (alive, audit_records, cli, free_port, http_status, install_standin_release, kill_group,
                           pidfile_pid, wait_until, write_deploy_yaml)


@pytest.fixture
def standin(ssh_fleet, tmp_path):
    fleet = ssh_fleet(1)
    h = fleet.hosts[0]
    port = free_port()
    install_standin_release(h.deploy_root, port)
    cfg = write_deploy_yaml(tmp_path / "deploy.yaml", fleet.host_yaml(), port=port, model_path=str(tmp_path))
    yield h, port, cfg
    kill_group(pidfile_pid(h.deploy_root))


def _start(cfg) -> None:
    r = cli("runbook", "run", "connection-resets", "-c", str(cfg), "--yes")
    assert r.returncode == 0, r.stderr


def test_healthy_finds_nothing_and_changes_nothing(standin):
    h, port, cfg = standin
    _start(cfg)
    pid = pidfile_pid(h.deploy_root)
    before = len(audit_records(h.deploy_root))
    r = cli("runbook", "run", "connection-resets", "-c", str(cfg))  # no --yes, no input: nothing may be asked
    assert r.returncode == 0, r.stdout + r.stderr
    assert "healthy" in r.stdout and "declined" not in r.stdout + r.stderr
    assert pidfile_pid(h.deploy_root) == pid and alive(pid)
    recs = audit_records(h.deploy_root)[before:]
    assert [x["step"] for x in recs] == ["alive", "crash_log", "healthz", "ready"]
    assert all(x["ok"] and x["action"] is None and x["host"] == h.name and x["user"] for x in recs)
    assert recs[0]["observed"] is True and recs[0]["recorded"] == {"pid": pid}
    assert recs[2]["observed"] == 200 and len({x["run_id"] for x in recs}) == 1
    # the summary table names every step
    for step in ("alive", "crash_log", "healthz", "ready"):
        assert step in r.stdout


def test_crash_no_dry_run_then_yes(standin):
    h, port, cfg = standin
    _start(cfg)
    old = pidfile_pid(h.deploy_root)
    kill_group(old)  # the fault: the runtime died
    assert http_status(port, "/healthz") == 0

    # without --yes a "no" changes nothing
    r = cli("runbook", "run", "connection-resets", "-c", str(cfg), input="n\n")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "restart the runtime on" in r.stderr and "declined" in r.stdout
    assert http_status(port, "/healthz") == 0 and pidfile_pid(h.deploy_root) == old
    rec = audit_records(h.deploy_root)[-1]
    assert (rec["step"], rec["observed"], rec["outcome"], rec["dry_run"]) == ("alive", False, "declined", False)

    # no answer at all (stdin closed) is a no too
    r = cli("runbook", "run", "connection-resets", "-c", str(cfg))
    assert r.returncode == 1 and http_status(port, "/healthz") == 0

    # dry-run runs the checks, shows the action, does not run it
    r = cli("runbook", "run", "connection-resets", "-c", str(cfg), "--dry-run")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "would act" in r.stdout and "not run (dry-run)" in r.stdout
    assert http_status(port, "/healthz") == 0 and pidfile_pid(h.deploy_root) == old
    dry = [x for x in audit_records(h.deploy_root) if x["dry_run"]]
    assert dry and all(x["outcome"] in ("would act", "ok", "failed", "escalated") for x in dry)
    assert "Do it?" not in r.stderr

    # --yes: restarted, verified, and the run goes on to the other steps
    r = cli("runbook", "run", "connection-resets", "-c", str(cfg), "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    new = pidfile_pid(h.deploy_root)
    assert new != old and alive(new) and http_status(port, "/healthz") == 200
    recs = [x for x in audit_records(h.deploy_root) if x["run_id"] == audit_records(h.deploy_root)[-1]["run_id"]]
    assert recs[0]["outcome"] == "fixed" and "started the runtime" in recs[0]["result"]
    assert [x["step"] for x in recs] == ["alive", "crash_log", "healthz", "ready"]


def test_yes_answer_runs_the_action(standin):
    h, port, cfg = standin
    r = cli("runbook", "run", "connection-resets", "-c", str(cfg), input="y\n")
    assert r.returncode == 0, r.stdout + r.stderr
    assert wait_until(lambda: http_status(port, "/readyz") == 200, 5)


def test_unreachable_host_exits_4(standin, ssh_fleet):
    h, port, cfg = standin
    text = cfg.read_text().replace(f"port: {h.port}", f"port: {free_port()}")
    bad = cfg.with_name("bad.yaml")
    bad.write_text(text)
    r = cli("runbook", "run", "connection-resets", "-c", str(bad))
    assert r.returncode == 4, r.stdout + r.stderr
    assert h.name in r.stderr
