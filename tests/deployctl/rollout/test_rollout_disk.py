"""Disk by what is shipped (issue 41) on the sshd fleet with the stand-in engine and real nginx: a real tmpfs as one
host's deploy_root. A release that does not fit is refused before the lock and any upload, naming the host, the
path and both sizes, and the previous release keeps serving; leftovers of an interrupted upload count as free and
are removed by the next deploy, which says so in its output and the history; ``status`` shows each host's free
space and flags one under what the next deploy needs. The rule itself: tests/deployctl/preflight/test_preflight_disk.py."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from deployctl.config.units import format_bytes

pytestmark = [pytest.mark.timeout(300)]

MiB = 2**20


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _fill(path: Path, nbytes: int) -> None:
    with open(path, "wb") as f:
        for _ in range(nbytes // MiB):
            f.write(b"\1" * MiB)
        f.write(b"\1" * (nbytes % MiB))


def _disk(env, name: str) -> dict:
    return next(h for h in env.status()["hosts"] if h["host"] == name)["disk"]


def test_a_release_that_does_not_fit_is_refused_before_upload_and_leftovers_count_as_free(rollout_env):
    env = rollout_env(2, engine="standin")
    b = env.names[1]
    root = Path(env.host(b)["deploy_root"])
    root.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=120m", "tmpfs", str(root)]).returncode != 0:
        pytest.skip("mount tmpfs needs root")
    try:
        r = env.cli("deploy", "--yes")
        assert r.returncode == 0, r.stderr[-3000:]
        v1 = env.current(b)
        assert f"disk: {b}: deploy_root {root} needs" in r.stderr, r.stderr[-3000:]

        # status: the free space, and what the next deploy would need (the current release's size as its payload)
        disk = _disk(env, b)
        assert disk["path"] == str(root) and not disk["low"] and disk["leftover_bytes"] == 0
        assert abs(disk["free_bytes"] - _free(root)) < 2 * MiB
        need = disk["need_bytes"]
        assert 64 * MiB < need < 70 * MiB, disk  # the 64 MiB floor + 10% + 2 × the stand-in release

        # an interrupted upload's leftovers (the SFTP put's temp name, a half-unpacked dir) and the operator's own
        # file, leaving free + leftovers 8 MiB under what the deploy needs
        releases = root / "releases"
        tmp = releases / ".20260101T000000Z-0badc0de.tar.tmp-1234abcd"
        _fill(tmp, 12 * MiB)
        (releases / "20260101T000000Z-0badc0de.partial").mkdir()
        _fill(releases / "20260101T000000Z-0badc0de.partial" / "deployctl_runtime.whl", 4 * MiB)
        leftovers = 16 * MiB
        other = root / "operator-data.bin"
        _fill(other, _free(root) + leftovers - (need - 8 * MiB))

        env.cfg["engine"]["max_num_seqs"] = 6  # a new release
        env.write()
        before = {n: sorted(os.listdir(Path(env.host(n)["deploy_root"]) / "releases")) for n in env.names}
        r = env.cli("deploy", "--yes")
        assert r.returncode == 1, (r.returncode, r.stderr[-3000:])
        err = " ".join(r.stderr.split())
        assert f"{b}: deploy_root {root} needs" in err and "release payload 2 ×" in err and "margin" in err, err
        assert "free + 16.0 MiB held by 2 leftover(s) of interrupted uploads" in err, err
        assert "nothing was uploaded or changed" in err and "deployctl models prune" in err, err
        # nothing changed: no release, no lock, the leftovers still there; the previous release serves
        assert {n: sorted(os.listdir(Path(env.host(n)["deploy_root"]) / "releases")) for n in env.names} == before
        assert not (root / "state" / "lock").exists() and tmp.exists()
        assert env.current(b) == v1 and env.release_served(b) == v1

        # 12 MiB more disk: the release fits only with the leftovers' space counted, and they go
        total = os.statvfs(root).f_blocks * os.statvfs(root).f_frsize
        subprocess.run(["mount", "-o", f"remount,size={(total + 12 * MiB) // 1024}k", str(root)], check=True)
        assert _free(root) < need <= _free(root) + leftovers
        r = env.cli("deploy", "--yes")
        assert r.returncode == 0, r.stderr[-3000:]
        v2 = env.current(b)
        assert v2 != v1 and env.release_served(b) == v2
        err = " ".join(r.stderr.split())
        assert (f"{b}: removed leftovers of interrupted uploads: .20260101T000000Z-0badc0de.tar.tmp-1234abcd "
                f"({format_bytes(12 * MiB)}), 20260101T000000Z-0badc0de.partial" in err), err
        assert not tmp.exists() and not (releases / "20260101T000000Z-0badc0de.partial").exists()
        assert other.exists() and v1 in os.listdir(releases)  # not ours, and a kept release: both left alone
        cleanup = [h for h in env.history() if h["action"] == "cleanup"]
        assert [sorted(g["name"] for g in c["removed"][b]) for c in cleanup] == [
            [".20260101T000000Z-0badc0de.tar.tmp-1234abcd", "20260101T000000Z-0badc0de.partial"]]

        # status flags a host whose free space is under what the next deploy needs
        _fill(root / "more-data.bin", max(0, _free(root) - need // 2))
        disk = _disk(env, b)
        assert disk["low"] and disk["free_bytes"] < disk["need_bytes"], disk
        r = env.cli("status")
        assert r.returncode == 0 and "LOW" in r.stdout and f"disk LOW: {b}: deploy_root" in r.stdout, r.stdout
    finally:
        env.stop_runtimes()
        subprocess.run(["umount", "-l", str(root)])
