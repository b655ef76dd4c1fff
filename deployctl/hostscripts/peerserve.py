"""Serve one published model version to the other hosts of a deploy: peer copy (issue 43, model.peer_copy). Stdlib.

Shipped like the other scripts here (snippets.module_argv), run with the host's python:

- ``start DIR ADDRESS TIMEOUT_S``, the token in the environment (DEPLOYCTL_PEER_TOKEN: a capability, never on a
  command line that ps shows): binds ADDRESS on a free port, forks a detached server (setsid, stdio on /dev/null,
  so the SSH command returns at once) and prints one JSON line {"port": N, "pid": PID}. The server answers
  ``GET /TOKEN/<relative path>`` with that file of DIR (the published, verified version directory), honouring
  ``Range: bytes=N-`` / ``N-M`` (206, RFC 9110 §14.2); anything else is 404 (a wrong token, a path outside DIR, a
  dot-file) or 405 (not GET/HEAD). Read-only: it never writes. It exits after TIMEOUT_S seconds whatever happens.
- ``stop PID``: ends that server (SIGTERM); a server already gone is fine. Prints {"stopped": bool}.
"""
from __future__ import annotations

import http.server
import json
import os
import signal
import sys
import threading
import urllib.parse

CHUNK = 1 << 20


def _handler(root: str, token: str):
    root = os.path.realpath(root)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_args):  # stdio is /dev/null; keep quiet
            pass

        def _path(self):
            parts = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/").split("/", 1)
            if len(parts) != 2 or parts[0] != token:
                return None
            rel = parts[1]
            if not rel or any(p in ("", ".", "..") or p.startswith(".") for p in rel.split("/")):
                return None
            full = os.path.realpath(os.path.join(root, rel))
            return full if full.startswith(root + os.sep) and os.path.isfile(full) else None

        def _send(self, body_to: bool) -> None:
            full = self._path()
            if full is None:
                self.send_error(404)
                return
            size = os.path.getsize(full)
            start, end, status = 0, size - 1, 200
            rng = self.headers.get("Range", "")
            if rng.startswith("bytes="):
                a, _, b = rng[6:].partition("-")
                try:
                    start, end = int(a), (int(b) if b else size - 1)
                except ValueError:
                    self.send_error(416)
                    return
                end = min(end, size - 1)
                if start > end:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                status = 206
            self.send_response(status)
            self.send_header("Content-Length", str(end - start + 1))
            self.send_header("Accept-Ranges", "bytes")
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.end_headers()
            if not body_to:
                return
            with open(full, "rb") as f:
                f.seek(start)
                left = end - start + 1
                while left > 0:
                    block = f.read(min(CHUNK, left))
                    if not block:
                        break
                    self.wfile.write(block)
                    left -= len(block)

        def do_GET(self):
            self._send(True)

        def do_HEAD(self):
            self._send(False)

        def do_POST(self):
            self.send_error(405)

        do_PUT = do_DELETE = do_PATCH = do_POST

    return Handler


def start(root: str, address: str, timeout_s: float, token: str) -> dict:
    server = http.server.ThreadingHTTPServer((address, 0), _handler(root, token))
    server.daemon_threads = True
    port = server.server_address[1]
    pid = os.fork()
    if pid:
        server.server_close()
        return {"port": port, "pid": pid}
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    threading.Timer(timeout_s, lambda: os._exit(0)).start()
    try:
        server.serve_forever()
    finally:
        os._exit(0)


def stop(pid: int) -> bool:
    try:
        os.kill(pid, signal.SIGTERM)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def main(argv: list) -> int:
    if argv[:1] == ["start"] and len(argv) == 4:
        token = os.environ.get("DEPLOYCTL_PEER_TOKEN", "")
        if len(token) < 16:
            sys.stderr.write("DEPLOYCTL_PEER_TOKEN must hold a token of 16+ characters\n")
            return 2
        print(json.dumps(start(argv[1], argv[2], float(argv[3]), token)), flush=True)
        return 0
    if argv[:1] == ["stop"] and len(argv) == 2:
        print(json.dumps({"stopped": stop(int(argv[1]))}))
        return 0
    sys.stderr.write("usage: start DIR ADDRESS TIMEOUT_S (token in DEPLOYCTL_PEER_TOKEN) | stop PID\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
