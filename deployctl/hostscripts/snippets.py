"""Small standard-library scripts that run on a host with the host's own python (``python -c``), so they work
the same over SSH and for ``address: local``, and reach a runtime bound to the host's loopback.

Each prints one JSON object on stdout. Arguments travel as one JSON argv item.
"""
from __future__ import annotations

import json
from typing import Any

# One HTTP request to the runtime, made on its host (deployctl.service.http sends it). Arguments: url, method, json
# (a body, or null), timeout, env_file. The API key: $DEPLOYCTL_PROBE_KEY (deployctl's server.api_key_env, passed in
# the command's environment), else DEPLOYCTL_RUNTIME_API_KEY from env_file (the release's runtime.env, read on the
# host; never on a command line). Prints status (0: no HTTP answer), headers, body, error, elapsed_s.
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
    out["error"] = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
out["elapsed_s"] = time.monotonic() - t0
print(json.dumps(out))
"""

# Who listens on a TCP port: /proc/net/tcp{,6} socket inodes → /proc/PID/fd. "runtime" when the holder is the
# pid of the pidfile or a descendant of it (the launcher's child), or runs in the systemd unit's cgroup; "other"
# otherwise; "free" when nobody listens.
PORT_HOLDER = r"""
import json, os, sys
a = json.loads(sys.argv[1])
inodes = set()
for f in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        for line in open(f).read().splitlines()[1:]:
            p = line.split()
            if p[3] == "0A" and int(p[1].rsplit(":", 1)[1], 16) == a["port"]:
                inodes.add(p[9])
    except OSError:
        pass
holder = None
for pid in filter(str.isdigit, os.listdir("/proc")) if inodes else ():
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            if os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] in inodes:
                holder = int(pid)
                break
    except OSError:
        continue
    if holder:
        break
def ppid(p):
    try:
        return int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0
try:
    ours = int(open(a["pid_file"]).read().split()[0])
except (OSError, ValueError, IndexError):
    ours = None
value, chain = "free", []
if inodes:
    value = "other"
    try:
        if holder and a.get("unit") and ("/" + a["unit"]) in open(f"/proc/{holder}/cgroup").read():
            value = "runtime"
    except OSError:
        pass
    p = holder
    while p and p > 1 and len(chain) < 64:
        chain.append(p)
        if p == ours:
            value = "runtime"
        p = ppid(p)
name = None
if holder:
    try:
        name = open(f"/proc/{holder}/comm").read().strip()
    except OSError:
        pass
print(json.dumps({"value": value, "pid": holder, "process": name, "pidfile_pid": ours}))
"""

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
