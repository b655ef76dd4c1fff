"""A real nginx serving a directory over plain HTTP on 127.0.0.1 (model.source https://... tests), with an access
log of ``method uri status body_bytes_sent range`` lines. nginx answers Range requests with 206 on static files."""
from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

from support.nginx import nginx_binary
from support.ports import free_port


class FileServer:
    def __init__(self, root: Path, prefix: Path):
        self.root, self.prefix, self.port = Path(root), Path(prefix), free_port()
        self.prefix.mkdir(parents=True, exist_ok=True)
        self.log = self.prefix / "access.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "FileServer":
        p = self.prefix
        user = "user root;\n" if os.geteuid() == 0 else ""
        temps = "".join(f"{k}_temp_path {p}/{k};\n" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        (p / "nginx.conf").write_text(
            f"{user}worker_processes 1;\npid {p}/nginx.pid;\nerror_log {p}/error.log;\nevents {{}}\nhttp {{\n"
            f"log_format files '$request_method $uri $status $body_bytes_sent \"$http_range\"';\n"
            f"access_log {self.log} files;\n{temps}"
            f"server {{ listen 127.0.0.1:{self.port}; root {self.root}; }}\n}}\n")
        self.proc = subprocess.Popen([nginx_binary(), "-p", str(p), "-c", str(p / "nginx.conf"), "-g", "daemon off;"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"nginx exited: {self.proc.stderr.read().decode()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        raise AssertionError("nginx did not listen")

    def entries(self) -> list[tuple[str, str, int, int, str]]:
        """(method, uri, status, body bytes sent, Range header) per request so far."""
        out = []
        for line in self.log.read_text().splitlines() if self.log.exists() else []:
            method, uri, status, sent, rng = line.split(" ", 4)
            out.append((method, uri, int(status), int(sent), rng.strip('"')))
        return out

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
