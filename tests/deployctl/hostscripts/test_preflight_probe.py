"""The probe script run as preflight runs it (`python -I - PARAMS` with the source on stdin): port
holders from /proc, TIME_WAIT not counted, the runtime python's torch, the model directory."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

from deployctl.hostscripts.probe import FACT_KEYS

from support.paths import REPO
from support.ports import free_port


def run_probe(**params) -> dict:
    src = (REPO / "deployctl" / "hostscripts" / "probe.py").read_text()
    proc = subprocess.run([sys.executable, "-I", "-", json.dumps(params)], input=src, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_probe_facts_on_this_machine(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"num_hidden_layers": 2}')
    (model / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    port = free_port()
    f = run_probe(deploy_root=str(tmp_path / "root" / "x"), model_path=str(model), port=port, python=sys.executable)
    assert set(FACT_KEYS) <= set(f)
    assert f["os"]["system"] == "Linux" and f["os"]["kernel"]
    # host RAM (a sleeping standby keeps its weights there): MemAvailable, bytes
    assert 0 < f["memory"]["available_bytes"] <= f["memory"]["total_bytes"] and f["memory"]["error"] is None
    # no GPU here: NVML's own error text, not a crash
    assert f["nvidia"]["available"] is False and f["nvidia"]["error"]
    assert f["torch"]["ok"] and f["torch"]["version"].startswith("2.") and f["torch"]["python"] == sys.executable
    assert f["port"]["free"] is True and f["port"]["holders"] == []
    roles = {d["role"]: d for d in f["disk"]}
    assert roles["deploy_root"]["exists"] is False and roles["deploy_root"]["checked_path"] == str(tmp_path)
    assert roles["deploy_root"]["free_bytes"] > 0
    assert {x["path"] for x in f["model"]["files"]} == {"config.json", "tokenizer_config.json"}
    assert f["model"]["config"] == {"num_hidden_layers": 2} and f["model"]["chat_template"] == "tokenizer_config.json"


def test_port_held_by_http_server_names_pid_and_process(tmp_path):
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        f = run_probe(port=port, bind="127.0.0.1", python="/nonexistent/python")
        assert f["port"]["free"] is False
        [holder] = f["port"]["holders"]
        assert holder["pid"] == server.pid and "http.server" in holder["cmdline"]
        assert holder["name"].startswith("python")
        # a wildcard bind conflicts with the loopback listener too
        assert run_probe(port=port, bind="0.0.0.0", python="/nonexistent/python")["port"]["holders"][0]["pid"] == server.pid
        assert f["torch"]["ok"] is False and "nonexistent" in f["torch"]["error"]
    finally:
        server.terminate()
        server.wait(10)


def test_time_wait_alone_does_not_count():
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = listener.accept()
    conn.close()  # the server side closes first: its socket goes to TIME_WAIT on `port`
    client.recv(1)
    client.close()
    listener.close()
    states = [line.split()[3] for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
              if int(line.split()[1].rsplit(":", 1)[1], 16) == port]
    assert "06" in states  # TIME_WAIT is there
    f = run_probe(port=port, python="/nonexistent/python")
    assert f["port"]["free"] is True and f["port"]["holders"] == []


def test_shipped_scripts_import_only_the_standard_library():
    """probe.py and weights.py run with a host's bare python: stdlib only (pynvml where present)."""
    import ast

    for name in ("probe.py", "weights.py"):
        tree = ast.parse((REPO / "deployctl" / "hostscripts" / name).read_text())
        mods = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        mods |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert mods - set(sys.stdlib_module_names) <= {"pynvml"}, (name, mods - set(sys.stdlib_module_names))
