"""The rollout journal (deployctl.rollout.journal), the resume decision (deployctl.rollout.resume) and the detached
runner's watch (deployctl.rollout.detach) on plain files and real processes: no fleet."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from deployctl.rollout import detach, journal, procs
from deployctl.rollout.resume import NothingToResume, load
from support.runner import runner_like


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("DEPLOYCTL_STATE", str(tmp_path / "state"))
    monkeypatch.delenv("DEPLOYCTL_TEST_KILL_AT", raising=False)
    monkeypatch.setenv("DEPLOYCTL_DETACH", "process")  # the daemonized path, on a systemd-booted machine too
    return tmp_path / "state" / "svc"


def test_progress_reads_steps_switched_hosts_and_ignores_a_torn_last_line(state):
    j = journal.Journal("svc")
    j.start({"release": {"id": "R2"}, "generation": 7})
    j.begin("upload")
    j.end("upload")
    j.begin("activate", switch=["gpu-a"])
    with open(state / "journal.jsonl", "a") as f:
        f.write('{"kind": "end", "step": "activ')  # a kill in the middle of a write
    p = journal.Progress.of(journal.read("svc"))
    assert p.done == {"upload"} and p.open_step == "activate" and p.touched == {"gpu-a"}
    assert p.unfinished and p.abort_reason is None
    j2 = journal.Journal("svc")
    j2.start({"release": {"id": "R3"}})  # a new deploy keeps the old journal beside
    assert json.loads((state / "journal.prev.jsonl").read_text().splitlines()[0])["release"]["id"] == "R2"


def test_nothing_to_resume_without_a_journal_or_after_its_finish(state):
    class Cfg:
        class service:
            name = "svc"

    with pytest.raises(NothingToResume, match="no deploy journal for svc"):
        load(Cfg)
    j = journal.Journal("svc")
    j.start({"release": {"id": "R1"}})
    j.finish("done", 0)
    with pytest.raises(NothingToResume, match=r"the last deploy \(R1\) finished: done \(exit 0\)"):
        load(Cfg)


@pytest.mark.parametrize("spec, last", [("3", ("begin", "activate")), ("point:upload:put", ("point", None)),
                                        ("begin:activate", ("begin", "activate"))])
def test_the_kill_hook_sigkills_right_after_the_named_record(state, spec, last):
    code = textwrap.dedent("""
        from deployctl.rollout.journal import Journal
        j = Journal("svc")
        j.start({"release": {"id": "R"}})
        j.point("upload:put", host="gpu-a")
        j.begin("activate", switch=["gpu-a"])
        j.end("activate")
        print("not killed")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**__import__("os").environ, "DEPLOYCTL_TEST_KILL_AT": spec})
    assert r.returncode == -signal.SIGKILL, r.stderr
    recs = journal.read("svc")
    assert (recs[-1]["kind"], recs[-1].get("step")) == last
    assert "not killed" not in r.stdout


def test_watch_prints_the_log_and_returns_the_runners_exit_code_or_says_it_died(state):
    lines = []
    script = "import sys, time; print('step 1/2', flush=True); time.sleep(0.5); print('done', flush=True)"
    pid, log, how = detach.spawn("svc", ["--version"])  # a real detached process (exits at once, records no exit)
    with pytest.raises(detach.RunnerDied, match="ended without finishing") as e:
        detach.watch("svc", lines.append, timeout_s=60)
    assert e.value.exit_code == 4 and "deploy --resume" in e.value.fix
    while procs.pid_running(pid):  # not a runner (no --runner svc): watch may say so before it wrote its last line
        time.sleep(0.05)
    # a runner that records its exit code: watch returns it after printing every line
    f = detach.files("svc")
    with open(f.log, "w") as out:
        p = runner_like(state.parent.parent, "svc", script + f"; open({str(f.exit)!r}, 'w').write('6\\n')", stdout=out)
    f.pid.write_text(f"{p.pid}\n")
    lines.clear()
    assert detach.watch("svc", lines.append, timeout_s=60) == 6
    p.wait()
    assert lines == ["step 1/2", "done"]


def test_status_shows_a_deploy_killed_at_its_start_record_as_unfinished(state):
    """Killed right after its ``start`` record, before it wrote rollout.json: the hosts still record the last
    deploy (another release, done, an older generation); status must show the journal's deploy unfinished and
    resumable. A journal superseded on the hosts (a rollback since: a newer generation) is not shown."""
    from deployctl.rollout.state import RolloutState
    from deployctl.rollout.status import journal_status

    class Cfg:
        class service:
            name = "svc"

    j = journal.Journal("svc")
    j.start({"release": {"id": "R2"}, "generation": 5})
    last = RolloutState(release="R1", status="done", generation=4)
    jr = journal_status(Cfg, last)
    assert jr is not None and jr["release"] == "R2" and jr["done"] == [] and jr["open_step"] is None, jr
    # the journal's pid is this test's (alive, but no `deployctl deploy`): the deploy is gone
    assert not jr["finished"] and jr["pid"] == os.getpid() and jr["resumable"] is True, jr
    assert journal_status(Cfg, None)["resumable"] is True  # a first deploy: no rollout.json at all
    assert journal_status(Cfg, RolloutState(release="R1", status="rolled_back", generation=6)) is None


def test_a_runners_start_is_a_restart_only_when_its_spawn_journaled_an_unfinished_deploy(state):
    from deployctl.rollout import runner

    f = detach.files("svc")
    f.dir.mkdir(parents=True)
    f.spec.write_text(json.dumps({"token": "t1", "how": "systemd", "unit": "deployctl-rollout-svc.service"}))
    journal.Journal("svc").start({"release": {"id": "R1"}})  # another deploy's journal (no token)
    first = runner.started("svc")
    assert (first.token, first.unit, first.restart, first.finish) == ("t1", "deployctl-rollout-svc.service", False,
                                                                      None)
    assert int(f.pid.read_text()) == os.getpid()
    j = journal.Journal("svc", runner="t1")
    j.start({"release": {"id": "R2"}})  # the first start's deploy, then a kill
    assert runner.started("svc").restart is True
    j.adopt()
    j.finish("done", 0)  # killed after its finish, before runner.exit
    again = runner.started("svc")
    assert again.restart is False and again.finish["exit_code"] == 0
    f.env.write_text("X=1\n")
    runner.record_exit("svc", 6)
    assert f.exit.read_text() == "6\n" and not f.env.exists()


def test_step_ids_read_as_their_weight_and_batch():
    # `weight:0` (the first weight step) read like 0% in status and resume messages
    p = journal.Progress.of([{"kind": "start", "steps": [5, 50, 100], "batches": [["a"], ["b", "c"]]}])
    assert p.label("weight:0") == "weight step 1/3 (5%)" and p.label("weight:2") == "weight step 3/3 (100%)"
    assert p.label("batch:1") == "batch 2/2" and p.label("activate") == "activate"
    assert p.label("weight:7") == "weight:7" and journal.Progress().label("weight:0") == "weight:0"  # beyond the plan: as is
    # odd ids come back as they are, never an exception (a hand-edited journal, a digit int() refuses)
    for odd in ("weight:\u00b2", "weight:\u0661", "weight:" + "9" * 5000, "weight:-1", "weight:1:2", 5, None):
        assert p.label(odd) == str(odd)
    assert journal.Progress.of([{"kind": "start", "steps": 5}]).label("weight:0") == "weight:0"


def test_the_steps_done_are_kept_in_the_order_they_ended():
    # "the step after" a resume names was the alphabetically last step done (weight step 2 after batch 1 ended)
    ends = ["upload", "drain", "activate", "validate", "outputs", "weight:0", "weight:1", "batch:0"]
    p = journal.Progress.of([{"kind": "start", "steps": [50, 100], "batches": [["a"], ["b"]]}]
                            + [{"kind": k, "step": s} for s in ends for k in ("begin", "end")])
    assert p.ended == ends and p.label(p.ended[-1]) == "batch 1/2" and p.open_step is None
