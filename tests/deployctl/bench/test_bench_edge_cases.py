"""`deployctl bench` against bad URLs, bad datasets and servers that answer garbage or nothing: one line, the
contract's exit code, never a traceback, never a hang past --timeout."""
from __future__ import annotations

import socket
import threading
import time

import pytest

FAST = ("--concurrency", "1", "--requests", "2", "--no-loadgen-check", "--model", "m")


def one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: "), stderr
    return last


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999", "http://[::1", "http://", "http://:8000"])
def test_url_without_a_usable_host_or_port_is_a_usage_error(run_bench, url):
    # port 99999 raised OverflowError from asyncio and "[::1" httpx.InvalidURL: tracebacks, exit 1
    code, _, err = run_bench("--url", url, *FAST, timeout=60)
    assert code == 2, err
    assert "--url" in one_line(err)


def test_dataset_that_is_not_utf8_is_a_config_error(run_bench, tmp_path):
    # read_text raised UnicodeDecodeError (a traceback)
    ds = tmp_path / "ds.jsonl"
    ds.write_bytes(b'{"prompt": "hi"}\n\xff\xfe\n')
    code, _, err = run_bench("--url", "http://127.0.0.1:9", "--dataset", str(ds), *FAST, timeout=60)
    assert code == 3, err
    line = one_line(err)
    assert str(ds) in line and "UTF-8" in line


def test_dataset_that_is_a_directory_is_a_config_error(run_bench, tmp_path):
    code, _, err = run_bench("--url", "http://127.0.0.1:9", "--dataset", str(tmp_path), *FAST, timeout=60)
    assert code == 3, err
    assert str(tmp_path) in one_line(err)


def _read_request(conn: socket.socket) -> None:
    """Read one whole HTTP request (headers, then Content-Length bytes of body). Closing with part of it unread
    makes the kernel reset the connection, and the client may then see the reset instead of the reply: a client
    that writes headers and body apart (httpx does) lost its answer at random."""
    conn.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return
        body += chunk


class RawServer:
    """A TCP server on 127.0.0.1 that answers every connection with ``reply`` bytes (None: never answers)."""

    def __init__(self, reply: bytes | None):
        self.reply = reply
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            if self.reply is not None:
                try:
                    _read_request(conn)
                    conn.sendall(self.reply)
                    conn.close()
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.fixture
def raw_server():
    servers = []

    def start(reply):
        servers.append(RawServer(reply))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


HTML = (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 27\r\nConnection: close\r\n\r\n"
        b"<html><body>hi</body></html>")
GARBAGE = b"\x00\xffnot http at all\r\n\r\n"
SSE_NO_JSON = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
               b"data: {not json\n\ndata: [DONE]\n\n")


@pytest.mark.parametrize("reply", [HTML, GARBAGE, SSE_NO_JSON], ids=["html", "garbage", "sse-bad-json"])
def test_server_answering_garbage_counts_errors_and_exits_1(run_bench, raw_server, reply):
    srv = raw_server(reply)
    code, _, err = run_bench("--url", f"http://127.0.0.1:{srv.port}", *FAST, "--timeout", "5", timeout=60)
    assert code == 1, err
    assert "no request" in one_line(err)


def test_server_that_never_answers_is_bounded_by_timeout(run_bench, raw_server):
    srv = raw_server(None)
    t0 = time.monotonic()
    code, _, err = run_bench("--url", f"http://127.0.0.1:{srv.port}", *FAST, "--timeout", "1", timeout=60)
    assert code == 1, err
    assert "no request" in one_line(err)
    assert time.monotonic() - t0 < 30  # 2 requests x 1 s, plus start-up; never a hang


OK_SSE = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
          b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}\n\n'
          b"data: [DONE]\n\n")


def test_huge_requests_with_a_short_level_limit_stays_bounded(run_bench, raw_server):
    # the whole pool (10**9 synthetic prompts of 128 words) was built before the first request: no output, a hang
    # and memory growing without bound, whatever --max-level-seconds said
    srv = raw_server(OK_SSE)
    t0 = time.monotonic()
    code, doc, err = run_bench("--url", f"http://127.0.0.1:{srv.port}", "--concurrency", "2", "--requests",
                               str(10**9), "--max-level-seconds", "1", "--no-loadgen-check", "--model", "m",
                               "--json", timeout=60)
    assert code == 0, err
    assert time.monotonic() - t0 < 30
    (level,) = doc["levels"]
    assert level["num_ok"] >= 1


def test_one_token_outputs_report_a_knee_without_tpot(run_bench, raw_server):
    # no TPOT can be measured from one chunk: the knee's TPOT limit is None and the summary line crashed with
    # "unsupported format string passed to NoneType.__format__" after the whole ladder had run
    srv = raw_server(OK_SSE)
    code, doc, err = run_bench("--url", f"http://127.0.0.1:{srv.port}", *FAST, "--json", timeout=60)
    assert code == 0, err
    assert "Traceback" not in err
    assert doc["knee"]["concurrency"] == 1 and doc["knee"]["tpot_p99_limit_ms"] is None
    assert "P99 TPOT <= - ms" in err


def test_concurrency_beyond_the_open_file_limit_is_a_usage_error(run_bench):
    # each in-flight request holds a socket: 100000 (limit 20000 here) ran past the fd limit (a minute of warm-up, then EMFILE
    # errors counted as server failures)
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        pytest.skip("no open-file limit in this process")
    too_many = soft + 1
    t0 = time.monotonic()
    code, _, err = run_bench("--url", "http://127.0.0.1:9", "--concurrency", f"1,{too_many}", "--requests", "1",
                             "--no-loadgen-check", "--model", "m", timeout=60)
    assert code == 2, err
    line = one_line(err)
    assert "--concurrency" in line and str(too_many) in line and "ulimit -n" in line
    assert time.monotonic() - t0 < 20


@pytest.mark.parametrize("flag", ["--timeout", "--max-level-seconds", "--rate"])
def test_infinite_bounds_are_usage_errors(run_bench, flag):
    # --timeout inf was accepted: a server that never answers then hung bench for ever
    code, _, err = run_bench("--url", "http://127.0.0.1:9", *FAST, flag, "inf", timeout=60)
    assert code == 2, err
    assert flag in one_line(err)


@pytest.mark.parametrize("name", ["x.txt", "noext", "adir"])
def test_plot_that_is_not_a_png_file_is_refused_before_the_ladder(run_bench, tmp_path, name):
    # x.txt: matplotlib's ValueError traceback after the whole ladder ran (and before --json printed: results lost);
    # noext / a directory: it wrote noext.png / adir.png and said "plot written to noext"
    (tmp_path / "adir").mkdir()
    code, _, err = run_bench("--url", "http://127.0.0.1:9", *FAST, "--plot", str(tmp_path / name), timeout=60)
    assert code == 2, err
    assert "--plot" in one_line(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir"]


def test_plot_of_a_ladder_where_nothing_succeeded_prints_no_matplotlib_warning(run_bench, tmp_path):
    # matplotlib's "UserWarning: No artists with labels found to put in legend" leaked onto stderr
    plot = tmp_path / "p.png"
    code, _, err = run_bench("--url", "http://127.0.0.1:9", *FAST, "--plot", str(plot), timeout=60)
    assert code == 1, err
    assert plot.stat().st_size > 0
    assert "UserWarning" not in err and "plot.py" not in err, err


@pytest.mark.parametrize("metrics_url", ["http://127.0.0.1:99999/metrics", "http://[::1/metrics", "notaurl"])
def test_bad_metrics_url_is_a_usage_error(run_bench, metrics_url):
    # the first two crashed the ladder (OverflowError / InvalidURL tracebacks out of the scrape)
    code, _, err = run_bench("--url", "http://127.0.0.1:9", *FAST, "--metrics-url", metrics_url, timeout=60)
    assert code == 2, err
    assert "--metrics-url" in one_line(err)


@pytest.mark.parametrize("spec", ["normal:nan,1", "normal:inf,1", "lognormal:inf,0.5", "1000000000", "1-1000000000"])
def test_length_spec_that_is_not_finite_or_is_absurd_is_a_usage_error(run_bench, spec):
    # nan/inf passed the spec check and crashed when sampled (ValueError/OverflowError tracebacks); 10**9 words per
    # prompt built for ever
    t0 = time.monotonic()
    code, _, err = run_bench("--url", "http://127.0.0.1:9", *FAST, "--input-len", spec, timeout=60)
    assert code == 2, err
    assert "--input-len" in one_line(err)
    assert time.monotonic() - t0 < 30


def test_wide_lognormal_lengths_are_clamped_not_overflowed():
    import random

    from deployctl.bench.workload import MAX_LEN, parse_length_spec

    sample = parse_length_spec("lognormal:128,1000", "--input-len")  # exp() of ~1000 sigma overflowed
    rng = random.Random(0)
    values = [sample(rng) for _ in range(200)]
    assert all(1 <= v <= MAX_LEN for v in values) and MAX_LEN in values and 1 in values


def test_long_synthetic_prompts_keep_the_pool_bounded(monkeypatch):
    # 4096 prompts of 2**20 words (a valid --input-len) was ~20 GB built before the first request
    from deployctl.bench import workload

    monkeypatch.setattr(workload, "WORD_BUDGET", 1000)
    pool = workload.synthetic(4096, "300", "4", seed=0)
    assert len(pool) == 4 and all(len(r.prompt.split()) == 300 for r in pool)


def test_connection_warm_up_is_bounded_by_the_request_timeout(raw_server):
    # the warm-up GET /v1/models waited a fixed 5 s per level on a silent server, whatever --timeout said
    import asyncio

    from deployctl.bench.client import Target, make_client
    from deployctl.bench.ladder import warm_connections

    srv = raw_server(None)

    async def warm() -> float:
        async with make_client(4, 0.3) as client:
            t0 = time.monotonic()
            await warm_connections(client, Target(base_url=f"http://127.0.0.1:{srv.port}"), 2, timeout=0.3)
            return time.monotonic() - t0

    assert asyncio.run(warm()) < 3.0  # 0.3 s asked; the old fixed bound was 5 s


def test_a_level_whose_requests_never_end_stops_at_its_deadline_plus_drain(raw_server):
    # validate's stability bursts against a server whose KV cache leaked full: every slot held by a request that
    # never ends kept the burst waiting for a free slot, then for the request timeout (a 5 s burst took 2 minutes)
    import asyncio
    import itertools

    from deployctl.bench.client import Target, make_client
    from deployctl.bench.ladder import LadderConfig, run_level
    from deployctl.bench.workload import BenchRequest

    srv = raw_server(None)
    cfg = LadderConfig(target=Target(base_url=f"http://127.0.0.1:{srv.port}"), timeout=60, max_level_s=1.0)
    pool = itertools.repeat(BenchRequest("hi", None, 4))

    async def level():
        async with make_client(4, 60) as client:
            return await run_level(client, cfg, pool, 2, count=10**9, drain_s=1.0)

    t0 = time.monotonic()
    results, _ = asyncio.run(level())
    assert time.monotonic() - t0 < 10  # 1 s level + 1 s drain, not the 60 s request timeout
    assert len(results) == 2 and all(r.error == "unfinished" for r in results)
    assert "1 s after the level's 1 s ended" in results[0].detail
