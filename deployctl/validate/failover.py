"""The failover layer: kill one runtime (SIGKILL, through the launcher) under load through the router, and measure
what users saw.

Load: closed loop of short streamed chat requests through the router (``concurrency`` in flight) for ``before_s``,
then the victim's runtime process (deployctl.service.launcher.runtime_pid) gets SIGKILL, and the load goes on for
``after_s`` while the victim's supervisor restarts it (a new runtime pid, then /readyz 200).

Reported (``details``): ``requests``, ``failed`` (with reasons), ``killed_pid``/``new_pid``, ``restart_s`` (kill
to a new runtime pid) and ``ready_s`` (kill to /readyz 200), and from the router's JSON access log (the rendered
log format, ``msec`` per request): ``router_stopped_s`` (kill to the end of the last request the router still
tried on the victim before it was back), ``retried`` (requests nginx passed to a second server) and ``resent``
(retries whose earlier attempt had connected: a POST that reached a model sent again; must be 0), and
``log_requests`` vs ``requests`` (one log line per client request: none answered twice).

Verdict ``fail`` when: the victim did not come back within ``after_s`` + ``ready_timeout_s``; a request was resent
after reaching a server; more requests failed than ``max_failed`` (default: 2 x ``concurrency``: the requests in
flight on the victim when it died, and those nginx put on kept-alive connections to it before it saw the first
failure, a POST it may not retry; ``max_fails=1`` takes the victim out at that first failure, and
``proxy_next_upstream error timeout`` moves every later request whose connection is refused).
A restarted runtime answers 503 while it loads; nginx neither retries such a POST (it reached the server) nor counts
it toward ``max_fails``, so ``router.fail_timeout_s`` must outlast the load time for the bound to hold (the problem
line says so with the measured ready time).
``skipped`` with fewer than two hosts or no router.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from typing import Any, Callable, Optional

from deployctl.bench.client import Target, make_client
from deployctl.bench.ladder import LadderConfig, run_level
from deployctl.bench.workload import BenchRequest
from deployctl.config import DeployConfig
from deployctl.config.layout import network_address, service_port, url_host
from deployctl.validate.result import LayerResult

PROMPT = "Count from one to ten."


def _load(url: str, model: Optional[str], api_key: Optional[str], concurrency: int, seconds: float,
          timeout: float, out: list) -> threading.Thread:
    target = Target(base_url=url, route="chat", model=model, api_key=api_key, ignore_eos=True)
    cfg = LadderConfig(target=target, concurrencies=(concurrency,), timeout=timeout, max_level_s=seconds)
    reqs = [BenchRequest(prompt=PROMPT, messages=None, max_tokens=32)]

    async def go() -> None:
        client = make_client(concurrency + 4, timeout)
        try:
            res, _ = await run_level(client, cfg, itertools.cycle(reqs), concurrency, count=10 ** 9)
            out.extend(res)
        finally:
            await client.aclose()

    t = threading.Thread(target=lambda: asyncio.run(go()), name="failover-load", daemon=True)
    t.start()
    return t


def _split(v: Any) -> list[str]:
    return [x.strip() for x in str(v or "").replace(" : ", ", ").split(",") if x.strip()]


def access_facts(text: str, victim_addr: str, kill_at: float, back_at: float) -> dict[str, Any]:
    """From JSON access log lines (the rendered format): inference requests logged, retried, resent after their
    earlier attempt connected, and the end (s after ``kill_at``, wall clock) of the last request that still tried
    ``victim_addr`` between the kill and ``back_at``."""
    logged = retried = resent = 0
    last_tried = None
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("request_method") != "POST" or not str(rec.get("uri", "")).startswith("/v1/"):
            continue
        logged += 1
        addrs, connects = _split(rec.get("upstream_addr")), _split(rec.get("upstream_connect_time"))
        if len(addrs) > 1:
            retried += 1
            if any(c != "-" for c in connects[:len(addrs) - 1]):
                resent += 1
        end = rec.get("msec")
        if victim_addr in addrs and isinstance(end, (int, float)) and kill_at <= end <= back_at:
            last_tried = max(last_tried or 0.0, end - kill_at)
    return {"log_requests": logged, "retried": retried, "resent": resent,
            "router_stopped_s": None if last_tried is None else round(last_tried, 3)}


def run_failover(cfg: DeployConfig, router_url: str, *, model: Optional[str], api_key: Optional[str],
                 victim: Optional[str] = None, concurrency: int = 4, before_s: float = 3.0, after_s: float = 15.0,
                 ready_timeout_s: float = 120.0, timeout: float = 60.0, max_failed: Optional[int] = None,
                 say: Callable[[str], None] = lambda _m: None) -> LayerResult:
    """Kill ``victim`` (default: the last host) under load and judge (module doc). Raises RemoteError when a
    host cannot be reached."""
    from deployctl.rollout.fleet import Fleet
    from deployctl.service import launcher
    from deployctl.service.engine import Engine

    if len(cfg.hosts) < 2 or cfg.router is None:
        return LayerResult("failover", "skipped", "failover: needs two or more hosts behind the router")
    fleet = Fleet(cfg, lambda _kind, m: say(m))
    fleet.connect()
    try:
        name = victim or cfg.hosts[-1].name
        host = fleet.hosts[name]
        hc = host.config
        pid = launcher.runtime_pid(host, cfg)
        if pid is None:
            return LayerResult("failover", "fail", f"failover: no runtime runs on {name}", [f"failover: {name} not running"])
        offset = fleet.router.access_log_size()
        results: list = []
        loader = _load(router_url, model, api_key, concurrency, before_s + after_s, timeout, results)
        time.sleep(before_s)
        kill_wall, kill_mono = time.time(), time.monotonic()
        host.run(f"kill -KILL {int(pid)}", timeout=30, check=False)
        say(f"failover: SIGKILL to the runtime on {name} (pid {pid})")
        new_pid = restart_s = ready_s = None
        deadline = kill_mono + after_s + ready_timeout_s
        while time.monotonic() < deadline:
            if new_pid is None:
                p = launcher.runtime_pid(host, cfg)
                if p is not None and p != pid:
                    new_pid, restart_s = p, time.monotonic() - kill_mono
            elif Engine(host, cfg).http("GET", "/readyz", timeout=5).status == 200:
                ready_s = time.monotonic() - kill_mono
                break
            time.sleep(0.2)
        loader.join(before_s + after_s + timeout + 30)
        text = ""
        settle = time.monotonic() + 5.0  # nginx logs a request after its last byte: let the last lines land
        while True:
            text = fleet.router.access_log_since(offset)[0]
            if access_facts(text, "", 0, 0)["log_requests"] >= len(results) or time.monotonic() > settle:
                break
            time.sleep(0.2)
    finally:
        fleet.close()
    addr = f"{url_host(network_address(hc))}:{service_port(cfg, hc)}"
    back = kill_wall + (ready_s if ready_s is not None else after_s + ready_timeout_s)
    log = access_facts(text, addr, kill_wall, back) if text else {}
    failed: dict[str, int] = {}
    for r in results:
        if not r.ok:
            failed[r.error] = failed.get(r.error, 0) + 1
    n_failed = sum(failed.values())
    bound = 2 * concurrency if max_failed is None else max_failed
    details = {"victim": name, "address": addr, "killed_pid": pid, "new_pid": new_pid, "concurrency": concurrency,
               "requests": len(results), "failed": n_failed, "failed_by_reason": failed, "max_failed": bound,
               "restart_s": _r(restart_s), "ready_s": _r(ready_s), **log}
    problems = []
    if ready_s is None:
        problems.append(f"restart: {name} was not back under its supervisor within {after_s + ready_timeout_s:g} s "
                        f"({'no new runtime pid' if new_pid is None else f'pid {new_pid} never ready'})")
    if log.get("resent"):
        problems.append(f"resent: {log['resent']} request(s) sent to a second server after reaching the first")
    if log and log["log_requests"] != len(results):
        problems.append(f"answered: the router logged {log['log_requests']} requests for {len(results)} sent")
    if n_failed > bound:
        hint = ""
        if failed.get("http_503"):  # nginx neither retries a POST answered 503 nor counts it toward max_fails
            hint = (f"; {failed['http_503']} were answered 503 by the restarted runtime while it loaded (ready after "
                    f"{_r(ready_s)} s): raise router.fail_timeout_s above its load time so a crashed host stays out "
                    "until it is ready")
        problems.append(f"failed: {n_failed} of {len(results)} requests failed ({failed}) > {bound}{hint}")
    stopped = log.get("router_stopped_s")
    summary = (f"failover: SIGKILL {name} under {concurrency} concurrent: {n_failed}/{len(results)} requests failed "
               f"(bound {bound}), router stopped sending after {stopped if stopped is not None else '?'} s, "
               f"back under its supervisor in {_r(ready_s) if ready_s is not None else '-'} s")
    if problems:
        summary += f"; FAIL: {problems[0]}"
    return LayerResult("failover", "fail" if problems else "pass", summary, problems, details)


def _r(v: Optional[float]) -> Optional[float]:
    return None if v is None else round(v, 3)
