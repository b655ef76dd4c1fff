"""The runtime's log file rotates by size with a bounded number of files, configured in the runtime.yaml --config
(log_file, log_max_bytes, log_backup_count); the standard library's RotatingFileHandler does the rotating."""
from __future__ import annotations

import subprocess
import sys

import httpx

from .conftest import RUNTIME_DIR, ServerProcess


def test_log_file_rotates_by_size_and_keeps_a_bounded_count(tiny_model, tmp_path):
    log = tmp_path / "logs" / "runtime.log"
    cfg = tmp_path / "runtime.yaml"
    cfg.write_text(f"model: {tiny_model}\nmax_model_len: 128\nkv_cache_memory: 8MiB\nlog_file: {log}\n"
                   "log_max_bytes: 1KiB\nlog_backup_count: 2\n")
    srv = ServerProcess(["--config", str(cfg)])
    try:
        srv.wait_ready()
        for _ in range(20):  # one access-log line (~200 bytes) per request
            httpx.post(srv.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1}, timeout=30)
    finally:
        assert srv.stop() == 0
    files = sorted(p.name for p in log.parent.iterdir())
    assert files == ["runtime.log", "runtime.log.1", "runtime.log.2"]
    assert all((log.parent / f).stat().st_size <= 1024 for f in files)
    assert "request_id=" in (log.parent / "runtime.log.1").read_text()


def test_a_backup_count_of_zero_is_refused_naming_the_key(tiny_model, tmp_path):
    cfg = tmp_path / "runtime.yaml"
    cfg.write_text(f"model: {tiny_model}\nlog_file: {tmp_path}/r.log\nlog_backup_count: 0\n")
    r = subprocess.run([sys.executable, "-m", "deployctl_runtime", "serve", "--config", str(cfg)], text=True,
                       capture_output=True, timeout=60, env={"PYTHONPATH": str(RUNTIME_DIR), "PATH": "/usr/bin"})
    assert r.returncode == 2 and "log_backup_count" in r.stderr and str(cfg) in r.stderr
