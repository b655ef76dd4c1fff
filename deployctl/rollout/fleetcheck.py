"""What each host really runs, and whether the fleet agrees (``status``, ``status --check``, the deploy's
preflight). "Different instances loaded different weights" is a named cause of inconsistent answers, so the
hosts are compared on what they serve, not only on what ``current`` points at.

``snapshot(host, cfg) -> dict`` (one command on the host):
  ``current_release``  the release ``current`` points at (None: nothing deployed)
  ``engine`` / ``engine_version``  release.json's engine_kind and engine_version (the bundled runtime's
                       version from its wheel name when release.json has none)
  ``model_manifest``   sha256 (first 12 hex) of the model manifest the running runtime loaded: the copy launch.sh
                       / the unit's ExecStartPre recorded at its start (shared/run/runtime.model.sha256), else the
                       manifest on disk now
  ``model_version`` / ``model_source`` / ``model_dtype`` / ``model_quantization``  release.json's (issue 43;
                       None for a release without model.source)
  ``config_hash``      release.json's config_hash (first 12 hex); ``config_drift`` names release files whose
                       sha256 no longer matches the release's manifest.sha256 (edited by hand)
  ``nvidia_driver`` / ``cuda`` / ``torch`` / ``torch_cuda`` / ``engine_installed``  release.json ``platform``:
                       the versions the deploy's preflight saw on this host (None when it did not run)
  ``supervised`` / ``runtime_running``  launch.sh's pid and the runtime's pid alive (process launcher), or the
                       unit active (systemd, which is both)
``differences(rows) -> list[str]``: one line per host that differs from the rest (majority value) on a field.
"""
from __future__ import annotations

import json
from collections import Counter
from typing import Any

from deployctl.config import DeployConfig
from deployctl.config.layout import current_link, pid_file, shared_dir

COMPARED = (("current_release", "release"), ("engine", "engine"), ("engine_version", "engine version"),
            ("model_manifest", "model manifest"),
            ("config_hash", "config hash"), ("model_version", "model version"), ("model_source", "model source"),
            ("model_dtype", "dtype"), ("model_quantization", "quantization"))
# release.json ``platform`` (recorded from the deploy's preflight facts): compared among the hosts that have it
PLATFORM_COMPARED = (("nvidia_driver", "NVIDIA driver"), ("cuda", "driver CUDA"), ("torch", "torch"),
                     ("torch_cuda", "torch CUDA build"), ("engine_installed", "installed engine"))

_SNIPPET = r"""
import hashlib, json, os, re, sys
a = json.loads(sys.argv[1])
out = {"current_release": None, "engine": None, "engine_version": None, "model_manifest": None, "config_hash": None, "config_drift": [],
       "model_version": None, "model_source": None, "model_dtype": None, "model_quantization": None,
       "nvidia_driver": None, "cuda": None, "torch": None, "torch_cuda": None, "engine_installed": None,
       "supervisor_pid": None, "runtime_pid": None, "supervised": False, "runtime_running": False}

def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()

def alive(pid_path):
    try:
        pid = int(open(pid_path).read().split()[0])
        os.kill(pid, 0)
        state = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[0]
        return pid, state != "Z"
    except (OSError, ValueError, IndexError):
        return None, False

try:
    target = os.readlink(a["current"])
    out["current_release"] = os.path.basename(target.rstrip("/"))
    rdir = os.path.realpath(a["current"])
    info = json.load(open(os.path.join(rdir, "release.json")))
    m = re.match(r"([A-Za-z0-9_.]+?)-([0-9][^-]*)-", info.get("runtime_wheel") or "")
    runtime = "%s %s" % (m.group(1), m.group(2)) if m else (info.get("runtime_wheel") or "unknown runtime")
    out["engine"] = info.get("engine_kind") or "deployctl-runtime"
    out["engine_version"] = info.get("engine_version") or (m.group(2) if m and out["engine"] == "deployctl-runtime" else None)
    out["config_hash"] = (info.get("config_hash") or "")[:12] or None
    for k in ("model_version", "model_source", "model_dtype", "model_quantization"):
        out[k] = info.get(k)
    plat = info.get("platform") or {}
    for k in ("nvidia_driver", "cuda", "torch", "torch_cuda"):
        out[k] = plat.get(k)
    out["engine_installed"] = plat.get("engine_version")
    for line in open(os.path.join(rdir, "manifest.sha256")):
        want, name = line.strip().split(None, 1)
        p = os.path.join(rdir, name)
        if os.path.exists(p) and sha(p) != want:
            out["config_drift"].append(name)
except (OSError, ValueError, KeyError, AttributeError):
    pass
try:
    out["model_manifest"] = open(a["loaded"]).read().split()[0][:12]
except (OSError, IndexError):
    try:
        out["model_manifest"] = sha(a["manifest"])[:12]
    except OSError:
        pass
out["supervisor_pid"], out["supervised"] = alive(a["pid_file"])
out["runtime_pid"], out["runtime_running"] = alive(a["child_pid_file"])
print(json.dumps(out))
"""


def loaded_manifest_file(h) -> str:
    """Where launch.sh / the unit record the sha256 of the model manifest at each runtime start."""
    return shared_dir(h, "run", "runtime.model.sha256")


def snapshot(host, cfg: DeployConfig) -> dict[str, Any]:
    """The host's facts (module doc). Raises RemoteError (SSH)."""
    import posixpath

    h = host.config
    args = {"current": current_link(h), "loaded": loaded_manifest_file(h), "pid_file": pid_file(h),
            "manifest": posixpath.join(cfg.model.path, cfg.model.manifest),
            "child_pid_file": shared_dir(h, "run", "runtime.child.pid")}
    r = host.run([h.python, "-S", "-c", _SNIPPET, json.dumps(args)], timeout=60)
    try:
        snap = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        snap = {"current_release": None, "supervised": False, "runtime_running": False}
    if h.launcher == "systemd":
        from deployctl.service.launcher import is_running

        snap["supervised"] = snap["runtime_running"] = is_running(host, cfg)
    return snap


def differences(rows: list[dict[str, Any]]) -> list[str]:
    """Lines naming each host whose release, engine, model manifest or config hash differs from the rest, and each
    host whose release files were edited by hand. Hosts with nothing deployed (or unreachable) are left out."""
    rows = [r for r in rows if r.get("current_release")]
    out: list[str] = []
    for key, label in COMPARED:
        values = Counter(r.get(key) for r in rows)
        if len(values) < 2:
            continue
        common, _ = values.most_common(1)[0]
        holders = [r["host"] for r in rows if r.get(key) == common]
        for r in rows:
            if r.get(key) != common:
                out.append(f"{r['host']}: {label} {r.get(key)} differs from the rest ({common} on "
                           f"{', '.join(holders)})")
    for key, label in PLATFORM_COMPARED:  # version drift: hosts without the record are left out
        known = [r for r in rows if r.get(key) is not None]
        values = Counter(r[key] for r in known)
        if len(values) < 2:
            continue
        common, _ = values.most_common(1)[0]
        holders = [r["host"] for r in known if r[key] == common]
        for r in known:
            if r[key] != common:
                out.append(f"{r['host']}: {label} {r[key]} differs from the rest ({common} on {', '.join(holders)}; "
                           "recorded by the deploy's preflight)")
    for r in rows:
        if r.get("config_drift"):
            out.append(f"{r['host']}: release files edited since the deploy: {', '.join(r['config_drift'])}")
    return out
