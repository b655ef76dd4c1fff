"""Which rollout failures are the infrastructure's (deployctl.rollout.infra): they abort with exit 4 and say so, not
with 6 and "fix the release". The SSH case end to end: test_rollout_c20.py (sshd stopped on the canary host)."""
from __future__ import annotations

from deployctl.errors import CheckFailed, HealthError, RolloutAborted
from deployctl.hosts.base import HostDeadline, HostUnreachable, RemoteCommandError
from deployctl.rollout.infra import kind
from deployctl.rollout.state import StateUnreadable


def test_ssh_disk_and_state_failures_are_the_infrastructures():
    assert kind(HostUnreachable("gpu-a: connection refused", host="gpu-a")) == "SSH"
    assert kind(HostDeadline("gpu-a gave no result in 120 s", host="gpu-a")) == "SSH"
    full = RemoteCommandError("`tar -x` failed on gpu-a with exit code 2", host="gpu-a",
                              stderr_tail="tar: releases/x/wheel: Cannot write: No space left on device")
    assert kind(full) == "disk"
    assert kind(StateUnreadable("gpu-a: state/rollout.json is not a valid rollout record")) == "state"
    try:  # a wrapped one counts by what it was raised from
        try:
            raise HostUnreachable("gpu-b: no route", host="gpu-b")
        except HostUnreachable as e:
            raise CheckFailed("switching to R failed on gpu-b") from e
    except CheckFailed as wrapped:
        assert kind(wrapped) == "SSH"


def test_the_releases_own_failures_are_not():
    assert kind(HealthError("gpu-a: sample inference failed: HTTP 500")) is None
    assert kind(RemoteCommandError("`pip install` failed on gpu-a with exit code 1", host="gpu-a",
                                   stderr_tail="ERROR: No matching distribution found for torch==9")) is None
    assert kind(RolloutAborted("analysis failed at 20%: canary error rate 0.4")) is None
    assert kind(None) is None
