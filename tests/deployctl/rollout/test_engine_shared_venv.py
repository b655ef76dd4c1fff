"""A foreign engine's pinned version is installed once per host and version (issue 26), not per release: the first
release that pins it pip-installs it into <deploy_root>/shared/engines/<dist>-<version>, later releases of that
version (and rollbacks to them) link to the same venv and install nothing, another version gets its own, and
`prune` removes a shared venv once no release left on the host links to it. The replicas of one machine
(hosts[].replicas) share one venv: it is installed once, and pruning one replica keeps what another links to.

Real parts: the release's real ENGINE_INSTALL script run by switch_and_install on a local host, real `python -m
venv`, real pip installing real wheels. pip reads a local directory (PIP_NO_INDEX, PIP_FIND_LINKS in the
environment the host's commands inherit) holding stand-in "sglang" wheels of two versions built here: no network.
"""
from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from deployctl.config import HostConfig
from deployctl.errors import RemoteError
from deployctl.hosts import Host
from deployctl.hostscripts.probe import probe_pinned_engine
from deployctl.rollout import release

pytestmark = pytest.mark.slow


def _wheel(where: Path, version: str) -> None:
    """A minimal, valid wheel of distribution ``sglang`` at ``version`` (PEP 427: RECORD with sha256s)."""
    files = {"sglang/__init__.py": f"__version__ = {version!r}\n",
             f"sglang-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n",
             f"sglang-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                   "Tag: py3-none-any\n"}
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    record.append(f"sglang-{version}.dist-info/RECORD,,")
    with zipfile.ZipFile(where / f"sglang-{version}-py3-none-any.whl", "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr(f"sglang-{version}.dist-info/RECORD", "\n".join(record) + "\n")


@pytest.fixture
def fleet_host(tmp_path, monkeypatch):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for v in ("0.5.23", "0.5.24"):
        _wheel(wheels, v)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    hostenv = tmp_path / "hostenv"  # the host's python env: no sglang in it, so each release needs its own
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(hostenv)], check=True)
    (hostenv / ".deployctl-runtime-installed").write_text("wheel-sha\n")  # the runtime wheel: already there
    root = tmp_path / "root"
    cfg = HostConfig(name="h", address="local", deploy_root=str(root), launcher="process",
                     python=str(hostenv / "bin" / "python"))
    host = Host.from_config(cfg)
    yield host, root
    host.close()


def _release(root: Path, rid: str, version: str) -> None:  # root: the host's (a replica's) deploy_root
    d = root / "releases" / rid
    d.mkdir(parents=True)
    (d / "release.json").write_text(json.dumps({"release_id": rid, "engine_kind": "sglang",
                                                "engine_distribution": "sglang", "engine_version": version,
                                                "runtime_wheel_sha256": "wheel-sha"}, indent=2))  # as render writes it


def _engine_version(root: Path, rid: str) -> str:
    py = root / "releases" / rid / "engine" / "bin" / "python"
    return subprocess.run([str(py), "-c", "import sglang; print(sglang.__version__)"], capture_output=True,
                          text=True, check=True).stdout.strip()


def test_one_venv_per_engine_version_shared_by_releases_and_pruned_when_unused(fleet_host):
    host, root = fleet_host
    shared = root / "shared" / "engines"
    _release(root, "r1", "0.5.23")
    release.switch_and_install(host, "r1", timeout=300)
    venv = shared / "sglang-0.5.23"
    assert (root / "releases" / "r1" / "engine").resolve() == venv
    assert (venv / ".deployctl-installed").read_text() == "sglang==0.5.23 own venv, shared\n"
    # built where it stays: its console scripts name this venv's python (not a temporary path)
    assert (venv / "bin" / "pip").read_text().splitlines()[0].startswith(f"#!{venv}/bin/python")
    assert _engine_version(root, "r1") == "0.5.23"
    # what preflight's engine check reads on the host: not in hosts[].python, but in the shared venv
    facts = probe_pinned_engine(host.config.python, str(shared), "sglang", "0.5.23", "sglang")
    assert not facts["importable"] and facts["shared"]["version"] == "0.5.23" and facts["shared"]["importable"]
    assert probe_pinned_engine(host.config.python, str(shared), "sglang", "0.5.99", "sglang")["shared"] is None
    (venv / "installed-once").write_text("r1")  # a second install would replace the venv and lose this

    _release(root, "r2", "0.5.23")  # a new release of the same engine version: nothing installed
    release.switch_and_install(host, "r2", timeout=300)
    assert (root / "releases" / "r2" / "engine").resolve() == venv and (venv / "installed-once").exists()
    assert _engine_version(root, "r2") == "0.5.23"

    _release(root, "r3", "0.5.24")  # another version: its own venv beside the first
    release.switch_and_install(host, "r3", timeout=300)
    assert (root / "releases" / "r3" / "engine").resolve() == shared / "sglang-0.5.24"
    assert _engine_version(root, "r3") == "0.5.24"

    # a version no index has: the install fails before `current` moves, so it still names what serves (r3)
    _release(root, "r4", "0.5.99")
    with pytest.raises(RemoteError):
        release.switch_and_install(host, "r4", timeout=60)
    assert release.current_release(host) == "r3" and not (shared / "sglang-0.5.99" / ".deployctl-installed").exists()
    shutil.rmtree(root / "releases" / "r4")

    # r1 goes, r2 still links to 0.5.23: both venvs stay
    assert release.prune(host, 2, {"r3"}) == ["r1"]
    assert sorted(p.name for p in shared.iterdir() if p.is_dir()) == ["sglang-0.5.23", "sglang-0.5.24"]
    # r2 goes: no release links to 0.5.23 any more, so its venv goes too; r3's stays and still runs
    assert release.prune(host, 1, {"r3"}) == ["r2"]
    assert sorted(p.name for p in shared.iterdir() if p.is_dir()) == ["sglang-0.5.24"]
    assert _engine_version(root, "r3") == "0.5.24"


def test_the_replicas_of_one_machine_share_one_venv_and_prune_sees_every_replica(fleet_host):
    from deployctl.config import layout

    local, root = fleet_host
    reps = [Host.from_config(local.config.model_copy(update={"name": f"h-r{i}", "deploy_root": str(root / f"r{i}"),
                                                               "replica": i})) for i in (0, 1)]
    try:
        shared = root / "shared" / "engines"
        assert [layout.engines_dir(r.config) for r in reps] == [str(shared)] * 2
        for i, rep in enumerate(reps):
            _release(root / f"r{i}", "a1", "0.5.23")
            release.switch_and_install(rep, "a1", timeout=300)
            if i == 0:
                (shared / "sglang-0.5.23" / "installed-once").write_text("r0")  # replica 1 must not reinstall
        venv = shared / "sglang-0.5.23"
        assert all((root / f"r{i}" / "releases" / "a1" / "engine").resolve() == venv for i in (0, 1))
        assert (venv / "installed-once").exists() and not (root / "r0" / "shared" / "engines").exists()
        assert _engine_version(root / "r1", "a1") == "0.5.23"
        # replica 0 moves to 0.5.24 and prunes a1: replica 1's a1 still links to 0.5.23, so it stays
        _release(root / "r0", "a2", "0.5.24")
        release.switch_and_install(reps[0], "a2", timeout=300)
        assert release.prune(reps[0], 1, {"a2"}) == ["a1"]
        assert sorted(p.name for p in shared.iterdir() if p.is_dir()) == ["sglang-0.5.23", "sglang-0.5.24"]
        assert _engine_version(root / "r1", "a1") == "0.5.23"
        # replica 1 too: now nothing on the machine links to 0.5.23
        _release(root / "r1", "a2", "0.5.24")
        release.switch_and_install(reps[1], "a2", timeout=300)
        assert release.prune(reps[1], 1, {"a2"}) == ["a1"]
        assert sorted(p.name for p in shared.iterdir() if p.is_dir()) == ["sglang-0.5.24"]
    finally:
        for rep in reps:
            rep.close()


def test_an_engine_install_streams_pips_lines_and_a_reuse_installs_nothing(fleet_host):
    host, root = fleet_host
    _release(root, "p1", "0.5.23")
    lines: list[str] = []
    release.switch_and_install(host, "p1", timeout=300, on_progress=lines.append)
    assert lines[0].startswith("installing sglang==0.5.23 into ") and lines[0].endswith("(once per host)")
    assert any(ln.startswith("Successfully installed sglang-0.5.23") for ln in lines), lines
    _release(root, "p2", "0.5.23")
    again: list[str] = []
    release.switch_and_install(host, "p2", timeout=300, on_progress=again.append)
    assert again == []  # the shared venv is reused: no install, nothing to show
    _release(root, "p3", "0.5.99")  # what no index has: pip's own error reaches the operator, not only the exit
    failed: list[str] = []
    with pytest.raises(RemoteError):
        release.switch_and_install(host, "p3", timeout=60, on_progress=failed.append)
    assert any("ERROR" in ln and "sglang==0.5.99" in ln for ln in failed), failed


def test_install_progress_shows_first_errors_and_end_and_one_line_per_interval(monkeypatch):
    import time

    from deployctl.rollout import hostops

    monkeypatch.setattr(hostops, "INSTALL_PROGRESS_EVERY_S", 0.3)
    said = []
    show = hostops.install_progress(type("H", (), {"name": "gpu-a"})(),
                                    lambda kind, msg, **kw: said.append((kind, msg, kw)))
    show("installing vllm==0.33.0 into /d/shared/engines/vllm-0.33.0 (once per host)")
    for i in range(50):
        show(f"Collecting dep{i}")
    show("ERROR: No space left on device")
    time.sleep(0.35)
    show("Downloading torch (900 MB)")
    show("Successfully installed vllm-0.33.0")
    msgs = [m for _, m, _ in said]
    assert msgs == ["gpu-a: engine install: installing vllm==0.33.0 into /d/shared/engines/vllm-0.33.0 "
                    "(once per host)",
                    "gpu-a: engine install: ERROR: No space left on device (+50 lines)",
                    "gpu-a: engine install: Downloading torch (900 MB)",
                    "gpu-a: engine install: Successfully installed vllm-0.33.0"]
    assert all(kind == "host" and kw == {"host": "gpu-a"} for kind, _, kw in said)
    assert hostops.install_progress(None, None) is None
