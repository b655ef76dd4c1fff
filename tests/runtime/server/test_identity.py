"""GET /identity and the X-Deployctl-Instance header (runtime/deployctl_runtime/server/state.py identity(),
app.py, middleware.py): who a runtime process is, in every phase, for deployctl's check before it signals, sleeps
or wakes a process. Real server processes on CPU with the tiny model."""
from __future__ import annotations

import re
import subprocess
import sys
import time

import httpx

from .conftest import RUNTIME_DIR

KEY = "sk-identity-test-0123456789"
ARGS = ["--max-model-len", "256", "--kv-cache-memory", "2MiB", "--served-model-name", "tiny"]
HEX32 = re.compile(r"^[0-9a-f]{32}$")


def test_identity_answers_in_every_phase_without_a_key_and_every_response_names_the_instance(start_server,
                                                                                            tiny_model):
    t_start = time.time()
    env = {"DEPLOYCTL_RUNTIME_API_KEY": KEY, "DEPLOYCTL_RUNTIME_FAULT": "load_delay_s=3"}
    srv = start_server(["--model", str(tiny_model), *ARGS, "--release-id", "r-2026-01", "--replica-index", "2"],
                       env=env, key=KEY, ready=False).wait_port()
    r = httpx.get(srv.url + "/identity")  # no key: open like /healthz
    assert r.status_code == 200, r.text
    ident = r.json()
    assert ident["phase"] == "loading"
    assert ident["release"] == "r-2026-01" and ident["replica"] == 2
    assert ident["pid"] == srv.proc.pid and ident["port"] == srv.port
    assert HEX32.match(ident["instance"]), ident
    assert t_start - 1 <= ident["started_at"] <= time.time()
    assert r.headers["x-deployctl-instance"] == ident["instance"]
    assert r.headers["x-deployctl-release"] == "r-2026-01"

    srv.wait_ready()
    for path in ("/healthz", "/readyz", "/v1/models"):  # open, behind the key, and refused alike
        for headers in ({}, srv.headers):
            r = httpx.get(srv.url + path, headers=headers)
            assert r.headers["x-deployctl-instance"] == ident["instance"], (path, r.status_code)
    r = httpx.post(srv.url + "/v1/completions", headers=srv.headers,
                   json={"model": "tiny", "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200 and r.headers["x-deployctl-instance"] == ident["instance"]
    assert httpx.get(srv.url + "/identity").json() == {**ident, "phase": "ready"}

    assert httpx.post(srv.url + "/sleep?level=1", headers=srv.headers).status_code == 200
    assert httpx.get(srv.url + "/identity").json() == {**ident, "phase": "sleeping"}
    assert httpx.post(srv.url + "/wake_up", headers=srv.headers).status_code == 200
    assert httpx.get(srv.url + "/identity").json()["phase"] == "ready"


def test_each_start_is_a_new_instance_and_the_replica_defaults_to_0(start_server, tiny_model):
    a = start_server(["--model", str(tiny_model), *ARGS], ready=False)
    b = start_server(["--model", str(tiny_model), *ARGS], ready=False)
    ia, ib = (httpx.get(s.wait_port().url + "/identity").json() for s in (a, b))
    assert ia["instance"] != ib["instance"] and HEX32.match(ia["instance"]) and HEX32.match(ib["instance"])
    assert ia["replica"] == ib["replica"] == 0 and ia["release"] is None
    assert (ia["pid"], ia["port"]) == (a.proc.pid, a.port) and (ib["pid"], ib["port"]) == (b.proc.pid, b.port)


def test_a_negative_replica_index_is_a_setting_error(tiny_model):
    out = subprocess.run([sys.executable, "-m", "deployctl_runtime", "serve", "--model", str(tiny_model),
                          "--replica-index", "-1"], capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": str(RUNTIME_DIR), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 2, out.stderr
    assert "serve setting 'replica_index'" in out.stderr and "greater than or equal to 0" in out.stderr
