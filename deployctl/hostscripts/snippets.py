"""Small standard-library scripts that run on a host with the host's own python (``python -c``), so they work
the same over SSH and for ``address: local``, and reach a runtime bound to the host's loopback.

Each prints one JSON object on stdout. Arguments travel as one JSON argv item.
"""
from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path
from typing import Any

# One HTTP request to the runtime, made on its host (deployctl.service.http sends it). Arguments: url, method, json
# (a body, or null), timeout, env_file. The API key: $DEPLOYCTL_PROBE_KEY (deployctl's server.api_key_env, passed in
# the command's environment), else DEPLOYCTL_RUNTIME_API_KEY from env_file (the release's runtime.env, read on the
# host; never on a command line). Prints status (0: no HTTP answer), headers, body, error (words, no exception repr),
# error_kind (refused | timeout | reset | dns | other, when no HTTP answer), elapsed_s.
HTTP_PROBE = r"""
import json, os, sys, time, urllib.request, urllib.error
a = json.loads(sys.argv[1])
headers = {"Content-Type": "application/json"}
key = os.environ.get("DEPLOYCTL_PROBE_KEY")
if not key and a.get("env_file"):
    try:
        for line in open(a["env_file"]):
            k, _, v = line.strip().partition("=")
            if k == "DEPLOYCTL_RUNTIME_API_KEY" and v:
                key = v.strip().strip('"')
    except OSError:
        pass
if key:
    headers["Authorization"] = "Bearer " + key.split(",")[0]
data = json.dumps(a["json"]).encode() if a.get("json") is not None else None
req = urllib.request.Request(a["url"], data=data, method=a["method"], headers=headers)
t0 = time.monotonic()
out = {"status": 0, "headers": {}, "body": "", "error": ""}
try:
    with urllib.request.urlopen(req, timeout=a["timeout"]) as r:
        out.update(status=r.status, headers=dict(r.headers), body=r.read().decode("utf-8", "replace"))
except urllib.error.HTTPError as e:
    out.update(status=e.code, headers=dict(e.headers or {}), body=e.read().decode("utf-8", "replace"))
except Exception as e:
    why = getattr(e, "reason", e)
    kind = ("refused" if isinstance(why, ConnectionRefusedError) else
            "timeout" if isinstance(why, TimeoutError) or "timed out" in str(why) else
            "reset" if isinstance(why, (ConnectionResetError, ConnectionAbortedError, BrokenPipeError)) else
            "dns" if isinstance(why, OSError) and type(why).__name__ == "gaierror" else "other")
    text = getattr(why, "strerror", None) or str(why) or type(why).__name__
    out.update(error=text, error_kind=kind)
out["elapsed_s"] = time.monotonic() - t0
print(json.dumps(out))
"""

# A shell function: is pid $1 a live process? ``kill -0`` alone also succeeds on a zombie, which a process killed
# moments ago stays until its parent (init, for launch.sh's setsid'd supervisor) reaps it: a start that took
# that for the running supervisor started nothing (a hung runtime restarted by a runbook never came back).
SH_ALIVE = """alive() { kill -0 "$1" 2>/dev/null && ! grep -qs '^State:[[:space:]]*Z' "/proc/$1/status"; }"""

# Shell functions (after SH_ALIVE): ``ours PID ROOT``: PID is alive and is one of ROOT's supervisors or runtimes
# (its command line names ROOT/releases/, as launch.sh's does, or it runs in a release dir under ROOT, as the
# engine does); ``group_ours PGID ROOT``: the group's leader or any member is. A pidfile outlives its process (a
# reboot, a supervisor SIGKILLed before its cleanup) and the kernel reuses PIDs (pid_max is 32768 on many
# machines, wrapped within minutes on a busy one): a number alone names a stranger as often as not, and a stop
# that signalled it would kill an unrelated process group. ROOT is taken as given and resolved (readlink -f).
SH_OURS = r"""ours() { alive "$1" || return 1; local r; for r in "$2" "$(readlink -f "$2" 2>/dev/null)"; do
  [ -n "$r" ] || continue
  tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null | grep -qF -- "$r/releases/" && return 0
  case "$(readlink "/proc/$1/cwd" 2>/dev/null)" in "$r"/releases/*) return 0;; esac
done; return 1; }
group_ours() { local p; ours "$1" "$2" && return 0
  for p in $(pgrep -g "$1" 2>/dev/null); do ours "$p" "$2" && return 0; done; return 1; }"""

# The marker launch.sh puts in the environment of the engine it starts (and so of every process the engine starts,
# whatever its process group or session: a worker that calls setsid keeps it): ``DEPLOYCTL_INSTANCE=<deploy_root>``
# (as deploy.yaml gives it) and ``DEPLOYCTL_INSTANCE_PORT=<the port that supervisor serves on>``. The supervisor
# itself and its helpers do not carry it (they are found by their pidfile and SH_OURS).
INSTANCE_ENV, INSTANCE_PORT_ENV = "DEPLOYCTL_INSTANCE", "DEPLOYCTL_INSTANCE_PORT"

# Shell functions (after SH_ALIVE): ``engine_pids ROOT [PORT]`` prints the live pids whose environment at exec
# (/proc/PID/environ: readable for the processes of the same user) has DEPLOYCTL_INSTANCE=ROOT and, with PORT,
# DEPLOYCTL_INSTANCE_PORT=PORT: the engine processes of that deploy root (and port) that are left when their
# supervisor or main process is gone. Exact whole-entry matches (grep -z -x -F): ``/a/b`` never matches the replica
# root ``/a/b/r1``. The caller ($$) is never listed. ``describe_pids PID...``: "PID (comm), PID (comm)" for those
# still there.
SH_ENGINE_PIDS = r"""engine_pids() { local f p files
  files=$(grep -lzsxF -e "DEPLOYCTL_INSTANCE=$1" /proc/[0-9]*/environ 2>/dev/null); [ -n "$files" ] || return 0
  if [ -n "${2:-}" ]; then
    files=$(grep -lzsxF -e "DEPLOYCTL_INSTANCE_PORT=$2" $files 2>/dev/null); [ -n "$files" ] || return 0
  fi
  for f in $files; do p=${f#/proc/}; p=${p%/environ}; [ "$p" != "$$" ] && alive "$p" && echo "$p"; done; return 0; }
describe_pids() { local p c s=""; for p; do c=$(cat "/proc/$p/comm" 2>/dev/null) || continue
  printf '%s%s (%s)' "$s" "$p" "$c"; s=", "; done; }"""

# Is the pidfile's process alive?
PROCESS_ALIVE = r"""
import json, os, sys
a = json.loads(sys.argv[1])

def alive(path):
    try:
        pid = int(open(path).read().split()[0])
    except (OSError, ValueError, IndexError, TypeError):
        return None, False
    try:
        os.kill(pid, 0)
        return pid, not open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return pid, False

pid, sup = alive(a["pid_file"])
child, run = alive(a.get("child_pid_file"))
# value: the service is live only with both, supervisor and runtime (C30: a runtime left by a killed supervisor
# serves, but nothing restarts it); no runtime pidfile at all: the supervisor is between restarts
print(json.dumps({"value": sup and (run or child is None), "pid": pid, "supervisor": sup,
                  "runtime_pid": child, "runtime": run}))
"""


def script_argv(python: str, script: str, args: dict[str, Any]) -> list[str]:
    """argv that runs ``script`` with ``args`` on a host."""
    return [python, "-c", script, json.dumps(args)]


def module_argv(python: str, module, *args: str) -> list[str]:
    """argv that runs ``module``'s source (one of this package's scripts) as __main__ with ``python`` and ``args``,
    the source carried on the command line (zlib + base64, a few KB): nothing is written on the host, and nothing
    rides on stdin (Fabric/invoke feeds a non-tty stdin one byte per 10 ms)."""
    blob = base64.b64encode(zlib.compress(Path(module.__file__).read_bytes(), 9)).decode()
    code = (f"import base64,zlib,__main__;exec(compile(zlib.decompress(base64.b64decode('{blob}')),"
            f"'deployctl-{module.__name__.rsplit('.', 1)[-1]}','exec'),__main__.__dict__)")
    return [python, "-c", code, *args]
