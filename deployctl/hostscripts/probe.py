"""The probe: a stdlib-only script that runs on a host and prints one JSON document of facts.

Preflight sends this file's source to the host and runs it with the host's configured python:
``python - '<params JSON>'`` with the source on stdin. It imports nothing of deployctl; pynvml
(nvidia-ml-py) is used when importable in that python; torch is probed in a subprocess of that python
with a timeout (``import torch`` takes about a second). Runs on Python >= 3.8, Linux.

Params (all optional): deploy_root, model_path, bind, port, gpu (index), torch_timeout_s, engine_distribution,
engine_module, fake_gpu_memory (tests: a stand-in GPU ledger path, see probe_fake_gpu).
The facts' keys are listed in ``FACT_KEYS``; see collect() for each section's shape. Memory and disk
sizes are bytes (integers).
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import struct
import subprocess
import sys
import time

PROBE_VERSION = 1
FACT_KEYS = ("probe_version", "hostname", "time", "os", "python", "nvidia", "torch", "engine", "memory", "disk", "port",
             "service", "model", "current_release", "more_ports", "space")
# Run by the runtime environment's python: the engine distribution's version (metadata, not assumed) and whether
# its module is importable (found on sys.path; not imported: vLLM's import initialises CUDA and takes seconds).
_ENGINE_SNIPPET = (
    "import importlib.metadata as m, importlib.util as u, json, sys\n"
    "d, mod = sys.argv[1], sys.argv[2]\n"
    "try:\n    v = m.version(d)\nexcept m.PackageNotFoundError:\n    v = None\n"
    "print(json.dumps({'version': v, 'importable': u.find_spec(mod) is not None,"
    " 'error': None if v else 'distribution %s is not installed' % d}))\n")

_TORCH_SNIPPET = r"""
import json, sys, warnings
out = {"ok": False}
try:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import torch
        out["version"] = torch.__version__
        out["cuda"] = torch.version.cuda
        out["cuda_available"] = bool(torch.cuda.is_available())
        out["device_count"] = torch.cuda.device_count() if out["cuda_available"] else 0
    out["warnings"] = [str(w.message)[:500] for w in caught if "cuda" in str(w.message).lower()][:3]
    out["ok"] = True
except BaseException as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, str(exc)[:500])
sys.stdout.write(json.dumps(out))
"""


def probe_os() -> dict:
    info = {"system": platform.system(), "kernel": platform.release(), "machine": platform.machine(), "distro": None}
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    info["distro"] = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return info


def _s(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


FAKE_GPU_ENV = "DEPLOYCTL_FAKE_GPU_MEMORY"


def probe_fake_gpu(path: str) -> dict:
    """The stand-in GPU of tests (runtime/deployctl_runtime/gpu_ledger.py; ``DEPLOYCTL_FAKE_GPU_MEMORY`` names the
    ledger file): one GPU whose memory total/used/free and processes come from the ledger's allocations (processes
    that no longer exist are not counted), in the shape probe_nvidia returns, with ``fake`` set to the path."""
    out = {"available": False, "error": None, "driver_version": "fake", "cuda_driver_version": None,
           "cuda_version": None, "gpus": [], "fake": path}
    try:
        with open(path) as f:
            data = json.load(f)
        total = int(data["total_bytes"])
        procs = []
        for pid, a in sorted((data.get("allocations") or {}).items()):
            if _running(int(pid)):
                procs.append({"pid": int(pid), "name": _proc_name(int(pid)), "cmdline": _proc_cmdline(int(pid)),
                              "used_memory": int(a["bytes"]), "what": a.get("what"), **_proc_origin(int(pid))})
    except (OSError, ValueError, KeyError, TypeError) as exc:
        out["error"] = "%s=%s: %s" % (FAKE_GPU_ENV, path, exc)
        return out
    used = sum(p["used_memory"] for p in procs)
    out["gpus"].append({"index": 0, "name": "fake GPU (%s)" % path, "uuid": data.get("uuid"),
                        "pci_bus_id": data.get("pci_bus_id"), "memory_total": total,
                        "memory_free": total - used, "memory_used": used, "compute_capability": None,
                        "processes": procs})
    out["available"] = True
    return out


GPU_IS_LOST = 15  # NVML_ERROR_GPU_IS_LOST (nvml.h): the GPU fell off the bus or is otherwise inaccessible


def _memory_health(pynvml, h) -> dict:
    """A GPU's pending memory repairs: ``retired_pages_pending`` (nvmlDeviceGetRetiredPagesPendingStatus; GPUs
    with page retirement, up to Volta/Turing) and ``remapped_rows`` (nvmlDeviceGetRemappedRows; Ampere and later:
    {"correctable", "uncorrectable", "pending", "failure"}); None where the driver answers Not Supported."""
    out = {"retired_pages_pending": None, "remapped_rows": None}
    try:
        out["retired_pages_pending"] = int(pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h)) == 1
    except Exception:
        pass
    try:
        corr, unc, pending, failure = pynvml.nvmlDeviceGetRemappedRows(h)
        out["remapped_rows"] = {"correctable": int(corr), "uncorrectable": int(unc), "pending": bool(pending),
                                "failure": bool(failure)}
    except Exception:
        pass
    return out


def _identity(pynvml, h) -> dict:
    """A GPU's identity that survives a reboot and an inherited CUDA_VISIBLE_DEVICES mask, where its NVML index
    may not: ``uuid`` (nvmlDeviceGetUUID, "GPU-5c1e7d52-..."; CUDA_VISIBLE_DEVICES takes it as an entry) and
    ``pci_bus_id`` (nvmlDeviceGetPciInfo().busId, "00000000:18:00.0", domain:bus:device.function); each None where
    the driver does not answer."""
    out = {"uuid": None, "pci_bus_id": None}
    try:
        out["uuid"] = _s(pynvml.nvmlDeviceGetUUID(h)) or None
    except Exception:
        pass
    try:
        out["pci_bus_id"] = _s(pynvml.nvmlDeviceGetPciInfo(h).busId) or None
    except Exception:
        pass
    return out


def probe_nvidia(fake_gpu_memory: str = "") -> dict:
    """Driver, the CUDA version it supports, and each GPU via NVML (with its ``uuid`` and ``pci_bus_id``,
    _identity, and its pending memory repairs, _memory_health); ``error`` holds NVML's text; ``gpu_errors`` the GPUs NVML lists but cannot read ({"index",
    "error", "lost": NVML_ERROR_GPU_IS_LOST}). With a ledger
    path (params ``fake_gpu_memory``, or ``DEPLOYCTL_FAKE_GPU_MEMORY`` in the probe's environment; tests), the
    stand-in GPU's ledger instead (probe_fake_gpu)."""
    fake = fake_gpu_memory or os.environ.get(FAKE_GPU_ENV)
    if fake:
        return probe_fake_gpu(fake)
    out = {"available": False, "error": None, "driver_version": None, "cuda_driver_version": None,
           "cuda_version": None, "gpus": [], "gpu_errors": []}
    try:
        import pynvml
    except ImportError as exc:
        out["error"] = "nvidia-ml-py (pynvml) is not importable in %s: %s" % (sys.executable, exc)
        return out
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        out["error"] = str(exc) or type(exc).__name__
        return out
    try:
        out["driver_version"] = _s(pynvml.nvmlSystemGetDriverVersion())
        cuda = int(pynvml.nvmlSystemGetCudaDriverVersion())
        out["cuda_driver_version"] = cuda
        out["cuda_version"] = "%d.%d" % (cuda // 1000, (cuda % 1000) // 10)
        for i in range(pynvml.nvmlDeviceGetCount()):
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            except Exception as exc:  # NVML_ERROR_GPU_IS_LOST: fell off the bus; the other GPUs still answer
                out["gpu_errors"].append({"index": i, "error": str(exc) or type(exc).__name__,
                                          "lost": getattr(exc, "value", None) == GPU_IS_LOST})
                continue
            gpu = {"index": i, "name": _s(pynvml.nvmlDeviceGetName(h)), "memory_total": int(mem.total),
                   "memory_free": int(mem.free), "memory_used": int(mem.used), "compute_capability": None,
                   "processes": [], **_identity(pynvml, h), **_memory_health(pynvml, h)}
            try:
                gpu["compute_capability"] = "%d.%d" % tuple(pynvml.nvmlDeviceGetCudaComputeCapability(h))
            except Exception:
                pass
            procs = []
            for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                try:
                    procs.extend(getattr(pynvml, getter)(h))
                except Exception:
                    pass
            seen = set()
            for p in procs:
                if p.pid in seen:
                    continue
                seen.add(p.pid)
                used = getattr(p, "usedGpuMemory", None)
                gpu["processes"].append({"pid": int(p.pid), "name": _proc_name(p.pid), "cmdline": _proc_cmdline(p.pid),
                                         "used_memory": int(used) if isinstance(used, int) else None,
                                         **_proc_origin(int(p.pid))})
            out["gpus"].append(gpu)
        out["available"] = True
    except Exception as exc:
        out["error"] = str(exc) or type(exc).__name__
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return out


def start_torch_probe(python: str):
    """Start ``python -c <snippet>`` (the runtime environment's torch); finish_torch_probe() collects it.
    Started first so that ``import torch`` overlaps the other probes."""
    try:
        return subprocess.Popen([python, "-c", _TORCH_SNIPPET], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True), None
    except OSError as exc:
        return None, str(exc)


def finish_torch_probe(started, python: str, timeout: float, t0: float) -> dict:
    """torch version, CUDA build and usability as seen by ``python``; never raises."""
    proc, error = started
    if proc is None:
        out = {"ok": False, "error": error}
    else:
        try:
            stdout, stderr = proc.communicate(timeout=max(0.1, timeout - (time.monotonic() - t0)))
            try:
                out = json.loads(stdout) if stdout.strip() else {"ok": False, "error": stderr.strip()[-500:]}
            except ValueError:
                out = {"ok": False, "error": (stdout + stderr).strip()[-500:]}
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            out = {"ok": False, "error": "import torch did not finish within %ss" % timeout}
    out["python"] = python
    out["duration_s"] = round(time.monotonic() - t0, 3)
    return out


def probe_engine(python: str, distribution: str, module: str, timeout: float = 30) -> dict:
    """{"python", "version", "importable", "error"} of the engine distribution in ``python``'s environment."""
    out = {"python": python, "version": None, "importable": False, "error": None}
    try:
        r = subprocess.run([python, "-c", _ENGINE_SNIPPET, distribution, module], stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=timeout)
        out.update(json.loads(r.stdout) if r.stdout.strip() else {"error": r.stderr.strip()[-300:] or "no answer"})
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        out["error"] = str(exc) or type(exc).__name__
    return out


def probe_pinned_engine(python: str, engines_dir: str, distribution: str, version: str | None, module: str) -> dict:
    """probe_engine in ``python``; when that is not ``version``, ``"shared"``: probe_engine in the machine's shared
    venv of that version (``<engines_dir>/<dist>-<version>``, config/layout.py engines_dir, rollout/release.py
    ENGINE_INSTALL), or None when there is none."""
    out = probe_engine(python, distribution, module)
    if version and out["version"] != version:
        shared = os.path.join(engines_dir, f"{distribution}-{version}", "bin", "python")
        out["shared"] = probe_engine(shared, distribution, module) if os.path.exists(shared) else None
    return out


def _nearest_existing(path: str) -> str:
    p = os.path.abspath(path)
    while not os.path.exists(p):
        p = os.path.dirname(p)
    return p


def probe_disk(paths: dict) -> list:
    """Per role ({"deploy_root": path, "model": path}): {"role", "path", "exists", "checked_path" (the path, or its
    nearest existing parent), "free_bytes" (available to an unprivileged user: statvfs f_bavail × f_frsize),
    "total_bytes", "device" (st_dev: two roles on one filesystem share their free bytes)}."""
    out = []
    for role, path in paths.items():
        if not path:
            continue
        checked = _nearest_existing(path)
        usage = shutil.disk_usage(checked)
        out.append({"role": role, "path": path, "exists": os.path.exists(path), "checked_path": checked,
                    "free_bytes": usage.free, "total_bytes": usage.total, "device": os.stat(checked).st_dev})
    return out


# What a killed upload leaves in <deploy_root>/releases/ (deployctl's own temporary names only; a release is
# <YYYYmmddTHHMMSSZ>-<8 hex> and never matches): the half-unpacked ``<id>.partial``, the uploaded ``<id>.tar`` not
# yet unpacked, the SFTP put's temp file ``.<id>.tar.tmp-<hex>`` (hosts/ssh.py), the local transport's
# ``.<id>.tar.<random>`` (hosts/local.py, mkstemp) and a fenced put's ``<id>.tar.fenced-<hex>`` (hosts/host.py).
def is_upload_leftover(name: str) -> bool:
    """``name`` (an entry of releases/) is a leftover of an interrupted upload (the comment above)."""
    if name.startswith("."):
        return ".tar." in name
    return name.endswith((".partial", ".tar")) or ".tar.fenced-" in name


def _du(path: str) -> int:
    """Bytes ``path`` holds on its filesystem (st_blocks × 512, as ``du``; symlinks not followed)."""
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    total = st.st_blocks * 512
    if os.path.isdir(path) and not os.path.islink(path):
        for root, dirs, files in os.walk(path):
            for name in dirs + files:
                try:
                    total += os.lstat(os.path.join(root, name)).st_blocks * 512
                except OSError:
                    continue
    return total


def probe_space(deploy_root: str, model_path: str, engines_dir: str, distribution: str, version: str) -> dict:
    """What the disk rule needs (deployctl/preflight/disk.py): ``disk`` (probe_disk of deploy_root and the model
    path), ``leftovers`` ([{"name", "bytes"}] of is_upload_leftover entries in releases/), ``release_bytes`` (what
    the current release directory holds: the next release's payload is about as big; None without one),
    ``engine_venv`` ("host env": this python has distribution==version; "shared": the machine's venv of it is
    installed (its .deployctl-installed marker); "missing"; None for the bundled runtime) and ``model`` ({"bytes":
    the .safetensors files' bytes present, "declared_bytes": model.safetensors.index.json metadata.total_size or
    None})."""
    out = {"disk": probe_disk({"deploy_root": deploy_root, "model": model_path}), "leftovers": [],
           "release_bytes": None, "engine_venv": None, "model": {"bytes": 0, "declared_bytes": None}}
    releases = os.path.join(deploy_root, "releases")
    try:
        names = sorted(os.listdir(releases))
    except OSError:
        names = []
    out["leftovers"] = [{"name": n, "bytes": _du(os.path.join(releases, n))} for n in names if is_upload_leftover(n)]
    current = os.path.join(deploy_root, "current")
    if os.path.isdir(current):
        out["release_bytes"] = _du(os.path.realpath(current))
    if distribution and version:
        try:
            import importlib.metadata as md
            have = md.version(distribution)
        except Exception:  # noqa: BLE001 - not installed, or no importlib.metadata (Python < 3.8)
            have = None
        marker = os.path.join(engines_dir, "%s-%s" % (distribution, version), ".deployctl-installed")
        out["engine_venv"] = ("host env" if have == version else "shared" if os.path.exists(marker) else "missing")
    if model_path and os.path.isdir(model_path):
        for root, _dirs, files in os.walk(model_path):
            out["model"]["bytes"] += sum(os.path.getsize(os.path.join(root, f)) for f in files
                                         if f.endswith(".safetensors"))
        try:
            with open(os.path.join(model_path, "model.safetensors.index.json")) as f:
                out["model"]["declared_bytes"] = int(json.load(f)["metadata"]["total_size"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return out


def _running(pid: int) -> bool:
    """PID exists and is not a zombie (a zombie has exited: its memory, GPU memory included, is freed; only its
    parent has not reaped it yet). State from /proc/PID/stat, the field after the parenthesised name."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X", "")


def _proc_name(pid: int) -> str:
    """The process name (/proc/PID/comm), "?" when it cannot be read."""
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return "?"


def _proc_cmdline(pid: int) -> str:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").strip().decode(errors="replace")[:200]
    except OSError:
        return ""


def _proc_origin(pid: int) -> dict:
    """Where a GPU process comes from: ``cwd`` (/proc/PID/cwd, "" when unreadable) and ``instance``: the marker
    deployctl's launch.sh puts in an engine's environment (DEPLOYCTL_INSTANCE deploy root, DEPLOYCTL_INSTANCE_PORT),
    as ``{"root", "port"}``, or None (no marker, or the environment is not readable: another user's process)."""
    try:
        cwd = os.readlink("/proc/%d/cwd" % pid)
    except OSError:
        cwd = ""
    instance = None
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
        root = env.get(b"DEPLOYCTL_INSTANCE")
        if root:
            port = env.get(b"DEPLOYCTL_INSTANCE_PORT", b"")
            instance = {"root": root.decode(errors="replace"), "port": int(port) if port.isdigit() else None}
    except OSError:
        pass
    return {"cwd": cwd, "instance": instance}


def _parse_addr(hex_addr: str) -> str:
    ip_hex, port_hex = hex_addr.split(":")
    raw = bytes.fromhex(ip_hex)
    if len(raw) == 4:
        ip = socket.inet_ntop(socket.AF_INET, struct.pack("<I", struct.unpack(">I", raw)[0]))
    else:
        words = struct.unpack("<4I", raw)
        ip = socket.inet_ntop(socket.AF_INET6, struct.pack(">4I", *words))
        if ip.startswith("::ffff:") and "." in ip:
            ip = ip[7:]
    return "%s:%d" % (ip, int(port_hex, 16))


def _listeners(port: int) -> list:
    """LISTEN sockets on ``port`` from /proc/net/tcp{,6}: [{"address", "inode"}]. TIME_WAIT is ignored."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if len(cols) < 10 or cols[3] != "0A":  # 0A = TCP_LISTEN
                        continue
                    if int(cols[1].rsplit(":", 1)[1], 16) == port:
                        found.append({"address": _parse_addr(cols[1]), "inode": int(cols[9])})
        except OSError:
            continue
    return found


def _inode_pids(inodes: set) -> dict:
    """{inode: pid} by reading /proc/*/fd links (only processes we may inspect)."""
    owners = {}
    targets = {"socket:[%d]" % i: i for i in inodes}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            for fd in os.listdir("/proc/%s/fd" % entry):
                link = os.readlink("/proc/%s/fd/%s" % (entry, fd))
                if link in targets:
                    owners.setdefault(targets[link], int(entry))
        except OSError:
            continue
    return owners


def _conflicts(address: str, bind: str) -> bool:
    host = address.rsplit(":", 1)[0]
    wildcard = ("0.0.0.0", "::", "")
    return host in wildcard or bind in wildcard or host == bind or (bind == "localhost" and host in ("127.0.0.1", "::1"))


def probe_port(bind: str, port: int) -> dict:
    """Is ``bind:port`` free? If not, the holders (pid, name) from /proc; plus a bind attempt."""
    out = {"bind": bind, "port": port, "free": True, "holders": [], "bind_error": None}
    listeners = [l for l in _listeners(port) if _conflicts(l["address"], bind)]
    owners = _inode_pids({l["inode"] for l in listeners}) if listeners else {}
    for l in listeners:
        pid = owners.get(l["inode"])
        out["holders"].append({"address": l["address"], "pid": pid, "name": _proc_name(pid) if pid else None,
                               "cmdline": _proc_cmdline(pid) if pid else None})
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    try:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is no conflict
        try:
            s.bind((bind, port))
        finally:
            s.close()
    except OSError as exc:
        out["bind_error"] = "%s (errno %s)" % (exc.strerror, exc.errno)
    out["free"] = not out["holders"] and out["bind_error"] is None
    return out


def probe_more_ports(ports: list) -> list:
    """probe_port for each of ``[[bind, port, what]]`` (the other ports deployctl allocates on the host:
    spare_port, dist_port), each with its ``what``."""
    return [dict(probe_port(b, int(p)), what=w) for b, p, w in ports]


def _descendants(root: int) -> list:
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _unit_pids(unit: str) -> list:
    """Pids running in the systemd unit's cgroup (``/proc/PID/cgroup`` names ``/<unit>``)."""
    def in_unit(pid: str) -> bool:
        try:
            with open("/proc/%s/cgroup" % pid) as f:
                return ("/" + unit) in f.read()
        except OSError:
            return False
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and in_unit(e)]


def _standby_pids(deploy_root: str) -> list:
    """The sleeping standby's supervisor and descendants: the port in ``shared/run/standby.json``, the pid in
    ``shared/run/runtime.<port>.pid`` (deployctl.rollout.standby); [] without one."""
    run = os.path.join(deploy_root, "shared", "run")
    try:
        with open(os.path.join(run, "standby.json")) as f:
            port = int(json.load(f)["port"])
        with open(os.path.join(run, "runtime.%d.pid" % port)) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return sorted(set(_descendants(pid))) if _running(pid) else []


def probe_service(deploy_root: str, unit: str = "") -> dict:
    """The running release's pid (``<deploy_root>/shared/run/runtime.pid``) and its descendants; with ``unit`` (a
    systemd unit name) also every pid in that unit's cgroup. ``standby_pids``: the sleeping standby's
    (``_standby_pids``)."""
    out = {"pid_file": None, "pid": None, "alive": False, "pids": _unit_pids(unit) if unit else [],
           "standby_pids": []}
    if not deploy_root:
        return out
    out["standby_pids"] = _standby_pids(deploy_root)
    pid_file = os.path.join(deploy_root, "shared", "run", "runtime.pid")
    out["pid_file"] = pid_file
    try:
        with open(pid_file) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return out
    out["pid"] = pid
    out["alive"] = _running(pid)
    out["pids"] = sorted(set(out["pids"]) | set(_descendants(pid) if out["alive"] else []))
    return out


def probe_pid_files(paths: list) -> dict:
    """{pid file: the pids of its process group (the pid and its descendants), [] when absent or dead}: whose GPU
    memory is whose (a rollback tells the serving runtime's from its sleeping standby's)."""
    out = {}
    for path in paths:
        try:
            with open(path) as f:
                pid = int(f.read().strip())
        except (OSError, ValueError):
            out[path] = []
            continue
        out[path] = sorted(set(_descendants(pid))) if os.path.exists("/proc/%d" % pid) else []
    return out


def probe_current_release(deploy_root: str):
    """What the host's current release was given: ``{"release_id", "gpus", "gpu_pinning"}`` from
    ``<deploy_root>/current/release.json`` (gpu_pinning: deployctl.render.gpupin's record, None for a release
    rendered without one), or None without a current release or a readable release.json."""
    if not deploy_root:
        return None
    try:
        with open(os.path.join(deploy_root, "current", "release.json")) as f:
            doc = json.load(f)
        return {"release_id": doc.get("release_id"), "gpus": doc.get("gpus"), "gpu_pinning": doc.get("gpu_pinning")}
    except (OSError, ValueError, AttributeError):
        return None


def probe_memory() -> dict:
    """Host RAM from /proc/meminfo: ``{"total_bytes", "available_bytes", "error"}`` (MemTotal, MemAvailable; None
    when unreadable). A sleeping standby keeps its weights there."""
    out = {"total_bytes": None, "available_bytes": None, "error": None}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    out["total_bytes" if key == "MemTotal" else "available_bytes"] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError) as exc:
        out["error"] = "/proc/meminfo: %s" % exc
    return out


def probe_model(path: str, max_files: int = 5000) -> dict:
    """The model directory's files (relative path, size), config.json, chat template presence and the
    weights bytes declared by safetensors headers (data_offsets)."""
    out = {"path": path, "exists": bool(path) and os.path.isdir(path), "files": [], "truncated": False,
           "config": None, "chat_template": None, "weights_bytes": None, "error": None}
    if not out["exists"]:
        return out
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d not in (".git", ".cache"))
        for name in sorted(files):
            full = os.path.join(root, name)
            if len(out["files"]) >= max_files:
                out["truncated"] = True
                break
            try:
                out["files"].append({"path": os.path.relpath(full, path), "size": os.path.getsize(full)})
            except OSError:
                continue
    try:
        with open(os.path.join(path, "config.json")) as f:
            out["config"] = json.load(f)
    except (OSError, ValueError) as exc:
        out["error"] = "config.json: %s" % exc
    out["chat_template"] = _chat_template_source(path)
    total, seen = 0, False
    for entry in out["files"]:
        if entry["path"].endswith(".safetensors"):
            try:
                with open(os.path.join(path, entry["path"]), "rb") as f:
                    (n,) = struct.unpack("<Q", f.read(8))
                    header = json.loads(f.read(min(n, 100 * 2**20)))
                total += sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__")
                seen = True
            except (OSError, ValueError, KeyError, TypeError, struct.error):
                continue
    out["weights_bytes"] = total if seen else None
    return out


def _chat_template_source(path: str):
    """Where the chat template comes from, or None: tokenizer_config.json, chat_template.jinja/.json."""
    try:
        with open(os.path.join(path, "tokenizer_config.json")) as f:
            if json.load(f).get("chat_template"):
                return "tokenizer_config.json"
    except (OSError, ValueError, AttributeError):
        pass
    for name in ("chat_template.jinja", "chat_template.json"):
        if os.path.isfile(os.path.join(path, name)):
            return name
    return None


def collect(params: dict) -> dict:
    """All facts for ``params``; every section is present even when its probe failed. ``params["sections"]``
    (a list of "port", "service", "nvidia", "pids", "more_ports", "model", "space") limits the run to those (plus probe_version, hostname and time)."""
    deploy_root = params.get("deploy_root") or ""
    if params.get("sections"):  # the cheap sections only (runbooks ask who holds the port)
        cheap = {"port": lambda: probe_port(params.get("bind", "127.0.0.1"), int(params.get("port", 8080))),
                 "service": lambda: probe_service(deploy_root, params.get("unit") or ""),
                 "nvidia": lambda: probe_nvidia(params.get("fake_gpu_memory") or ""),
                 "pids": lambda: probe_pid_files(params.get("pid_files") or []),
                 "more_ports": lambda: probe_more_ports(params.get("more_ports") or []),
                 "model": lambda: probe_model(params.get("model_path") or ""),
                 "space": lambda: probe_space(deploy_root, params.get("model_path") or "",
                                              params.get("engines_dir") or os.path.join(deploy_root, "shared",
                                                                                         "engines"),
                                              params.get("engine_distribution") or "",
                                              params.get("engine_version") or "")}
        return {"probe_version": PROBE_VERSION, "hostname": socket.gethostname(), "time": time.time(),
                **{name: cheap[name]() for name in params["sections"]}}
    model_path = params.get("model_path") or ""
    python = params.get("python") or sys.executable
    t0 = time.monotonic()
    torch_proc = start_torch_probe(python)
    facts = {"probe_version": PROBE_VERSION, "hostname": socket.gethostname(), "time": time.time(),
             "os": probe_os(), "python": {"executable": sys.executable, "version": platform.python_version()}}
    facts["nvidia"] = probe_nvidia(params.get("fake_gpu_memory") or "")
    facts["memory"] = probe_memory()
    facts["space"] = probe_space(deploy_root, model_path, params.get("engines_dir") or os.path.join(
        deploy_root, "shared", "engines"), params.get("engine_distribution") or "", params.get("engine_version") or "")
    facts["disk"] = facts["space"]["disk"]
    facts["port"] = probe_port(params.get("bind", "127.0.0.1"), int(params.get("port", 8080)))
    facts["service"] = probe_service(deploy_root, params.get("unit") or "")
    facts["model"] = probe_model(model_path)
    facts["current_release"] = probe_current_release(deploy_root)
    # the other ports deployctl allocates here (params more_ports: [[bind, port, what]]): probe_port each, + "what"
    facts["more_ports"] = probe_more_ports(params.get("more_ports") or [])
    facts["torch"] = finish_torch_probe(torch_proc, python, float(params.get("torch_timeout_s", 60)), t0)
    dist = params.get("engine_distribution")
    engines = params.get("engines_dir") or os.path.join(deploy_root, "shared", "engines")
    facts["engine"] = (probe_pinned_engine(python, engines, dist, params.get("engine_version"),
                                           params.get("engine_module") or dist) if dist else None)
    return {k: facts[k] for k in FACT_KEYS}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    params = json.loads(argv[0]) if argv else {}
    sys.stdout.write(json.dumps(collect(params)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
