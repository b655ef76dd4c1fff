"""The progress watchdog and systemd's notify protocol of the bundled runtime (server/watchdog.py, sd_notify.py,
lifecycle.py): real `deployctl-runtime serve` processes with the tiny model on CPU, the engine loop wedged by the
test-only fault stall_after_steps, and a real unix datagram socket standing in for systemd's NOTIFY_SOCKET."""
from __future__ import annotations

import json
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

ARGS = ["--max-model-len", "256", "--kv-cache-memory", "2MiB", "--served-model-name", "tiny"]


class NotifySocket:
    """A bound AF_UNIX datagram socket collecting (monotonic time, message) as systemd's notify socket would."""

    def __init__(self, path: str):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(0.2)
        self.got: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                continue
            except OSError:
                return
            self.got.append((time.monotonic(), data.decode()))

    def times(self, message: str) -> list[float]:
        return [t for t, m in list(self.got) if m == message]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


@pytest.fixture
def notify_socket(tmp_path):
    # a short path: AF_UNIX paths are limited to ~107 bytes and pytest's tmp_path can be longer
    path = f"/tmp/dr-notify-{os.getpid()}-{time.monotonic_ns()}.sock"
    ns = NotifySocket(path)
    yield ns
    ns.close()
    os.unlink(path)


def _chat(srv, stream: bool, max_tokens: int = 60) -> httpx.Response:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "count with me"}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": stream}
    return httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)


def test_a_wedged_engine_loop_is_503_engine_stalled_fails_its_requests_stops_the_pings_and_exits_4(
        start_server, tiny_model, notify_socket):
    timeout_s = 2.0
    srv = start_server(["--model", str(tiny_model), *ARGS, "--engine-stall-timeout-s", str(timeout_s)],
                       env={"DEPLOYCTL_RUNTIME_FAULT": "stall_after_steps=8,token_delay_ms=150",
                            "NOTIFY_SOCKET": notify_socket.path, "WATCHDOG_USEC": "400000"})
    # idle for longer than the stall timeout: never tripped, and the engine loop pings while idle
    time.sleep(timeout_s + 1)
    assert httpx.get(srv.url + "/healthz").status_code == 200
    assert notify_socket.times("READY=1"), notify_socket.got
    idle_pings = notify_socket.times("WATCHDOG=1")
    assert len(idle_pings) >= 10, idle_pings  # every 0.1 s (WATCHDOG_USEC / 4) while idle
    assert max(b - a for a, b in zip(idle_pings, idle_pings[1:])) < 0.4  # within systemd's WatchdogSec

    health: list[tuple[float, int, dict]] = []
    identities: list[dict] = []
    others: list[tuple[str, int, str]] = []
    stop = threading.Event()

    def watch_healthz():
        while not stop.is_set():
            try:
                r = httpx.get(srv.url + "/healthz", timeout=5)
                health.append((time.monotonic(), r.status_code, r.json()))
                if r.status_code == 503 and not identities:
                    identities.append(httpx.get(srv.url + "/identity", timeout=5).json())
                    for path in ("/readyz", "/health"):
                        other = httpx.get(srv.url + path, timeout=5)
                        others.append((path, other.status_code, other.json()["error"]["code"]))
            except (httpx.TransportError, ValueError):
                if srv.proc.poll() is not None:
                    return
            time.sleep(0.05)

    watcher = threading.Thread(target=watch_healthz)
    watcher.start()
    t0 = time.monotonic()
    first_chunk = threading.Event()

    def stream() -> tuple[int, list[str]]:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "count with me"}], "max_tokens": 60,
                "temperature": 0, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=60) as r:
            lines = []
            for line in r.iter_lines():
                if line.startswith("data: "):
                    lines.append(line[len("data: "):])
                    first_chunk.set()
            return r.status_code, lines

    with ThreadPoolExecutor(2) as pool:
        streamed = pool.submit(stream)
        assert first_chunk.wait(30)  # the stream runs; the engine wedges at its 9th forward pass (~1.2 s)
        whole = pool.submit(_chat, srv, False)
        whole, (stream_status, events) = whole.result(), streamed.result()
    code = srv.proc.wait(timeout_s + 10)
    elapsed = time.monotonic() - t0
    stop.set()
    watcher.join(10)

    assert code == 4, srv.log
    assert elapsed < timeout_s + 10, elapsed
    # the non-streaming request: 503 engine_stalled in OpenAI's error shape
    assert whole.status_code == 503, whole.text
    err = whole.json()["error"]
    assert err["code"] == "engine_stalled" and err["type"] == "service_unavailable"
    # the stream: its tokens so far, then an error event with the same code, then [DONE]
    assert stream_status == 200
    assert events[-1] == "[DONE]" and len(events) > 3
    assert json.loads(events[-2])["error"]["code"] == "engine_stalled", events[-3:]
    # /healthz went 200 -> 503 engine_stalled, naming the seconds since the last step and the step's phase
    stalled = [(t, body) for t, status, body in health if status == 503]
    assert stalled, health
    assert all(status == 200 for t, status, _ in health if t < stalled[0][0])
    message = stalled[0][1]["error"]["message"]
    assert stalled[0][1]["error"]["code"] == "engine_stalled"
    assert "no engine step completed for" in message and "(last phase: forward)" in message, message
    seconds = float(message.split("no engine step completed for ")[1].split(" s")[0])
    assert timeout_s <= seconds < timeout_s + 2, message  # printed to 0.1 s
    # the pings stopped once the engine loop was wedged: none from shortly after the requests came in
    assert not [t for t in notify_socket.times("WATCHDOG=1") if t > stalled[0][0] - timeout_s + 0.5]
    assert identities and identities[0]["phase"] == "stalled", identities
    assert others == [("/readyz", 503, "engine_stalled"), ("/health", 503, "engine_stalled")]
    assert "the engine is stalled" in srv.log and "exiting 4" in srv.log


def test_a_slow_but_moving_engine_and_an_idle_one_never_trip_the_watchdog(start_server, tiny_model):
    # each step takes 1 s (token_delay_ms), the timeout is 2.5 s, and the request takes ~6 s: a watchdog that
    # timed requests instead of steps would trip, one that counted an idle engine as stalled too
    srv = start_server(["--model", str(tiny_model), *ARGS, "--engine-stall-timeout-s", "2.5"],
                       env={"DEPLOYCTL_RUNTIME_FAULT": "token_delay_ms=1000"})
    time.sleep(3.5)  # idle past the timeout
    assert httpx.get(srv.url + "/healthz").status_code == 200
    t0 = time.monotonic()
    r = _chat(srv, False, max_tokens=5)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 5
    assert time.monotonic() - t0 > 4.5  # it was slow: longer than the timeout in all
    assert httpx.get(srv.url + "/healthz").status_code == 200
    assert httpx.get(srv.url + "/readyz").status_code == 200
    assert "stalled" not in srv.log
    assert srv.stop() == 0


def test_a_drain_that_finds_the_engine_wedged_exits_4_not_0(start_server, tiny_model):
    # the watchdog is off: the drain alone must notice that the engine never let go of the cut-off request
    srv = start_server(["--model", str(tiny_model), *ARGS, "--engine-stall-timeout-s", "0", "--drain-timeout-s", "1"],
                       env={"DEPLOYCTL_RUNTIME_FAULT": "stall_after_steps=2"})
    with ThreadPoolExecutor(1) as pool:
        stuck = pool.submit(_chat, srv, False)
        srv.wait_metrics(lambda m: m.get("deployctl_runtime_num_requests_running", 0) >= 1, timeout=20)
        time.sleep(0.5)
        assert stuck.running()
        srv.proc.send_signal(15)
        assert httpx.get(srv.url + "/identity", timeout=5).json()["phase"] == "draining"
        code = srv.proc.wait(30)
        stuck.result()
    assert code == 4, srv.log
    assert "the drain did not complete" in srv.log


def test_an_idle_drain_exits_0_and_says_stopping(start_server, tiny_model, notify_socket):
    srv = start_server(["--model", str(tiny_model), *ARGS, "--engine-stall-timeout-s", "1"],
                       env={"NOTIFY_SOCKET": notify_socket.path})
    assert _chat(srv, False, max_tokens=3).status_code == 200
    time.sleep(1.5)
    assert srv.stop() == 0, srv.log
    messages = [m for _, m in notify_socket.got]
    assert messages[0] == "READY=1" and "STOPPING=1" in messages
    assert "WATCHDOG=1" not in messages  # no WATCHDOG_USEC: systemd watches nothing, nothing is pinged


def test_notifier_reads_systemd_env(notify_socket):
    from deployctl_runtime.server.sd_notify import Notifier

    n = Notifier.from_env({"NOTIFY_SOCKET": notify_socket.path, "WATCHDOG_USEC": "2000000"})
    assert n.watchdog_s == 2.0 and n.ping_interval_s == 0.5
    n.ping()
    n.ping()  # rate-limited: within the interval, not sent again
    assert n.send("READY=1")
    deadline = time.monotonic() + 2
    while len(notify_socket.got) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [m for _, m in notify_socket.got] == ["WATCHDOG=1", "READY=1"]
    # WATCHDOG_PID naming another process: that one is watched, not this one
    assert Notifier.from_env({"NOTIFY_SOCKET": notify_socket.path, "WATCHDOG_USEC": "2000000",
                              "WATCHDOG_PID": "1"}).watchdog_s is None
    assert Notifier.from_env({"NOTIFY_SOCKET": "@abstract-name"}).address == "\0abstract-name"
    off = Notifier.from_env({})
    assert not off.enabled and off.send("READY=1") is False
