"""Cross-check `deployctl bench` against a field tool, guidellm, on the same workload against the runtime.

Run before a release (not part of the suite; it installs guidellm in its own venv, bench/.venv-guidellm, the
first time: torch 2.13.0 first, then guidellm 0.8.1):

    python bench/bench_crosscheck.py [--concurrency 1,4] [--requests 32] [--prompt-tokens 64] [--output-tokens 32]

It writes the runtime's tiny model, serves it on CPU, and for each concurrency runs guidellm (closed loop:
``--profile kind=concurrent,streams=C``, synthetic prompts of exactly PROMPT tokens by the model's own tokenizer,
OUTPUT tokens with ignore_eos) and then `deployctl bench` (closed loop at C, prompts of the words that make about
PROMPT tokens, --output-len OUTPUT --ignore-eos), twice each in ABBA order after a warm-up. It prints both tools' P50 TTFT, P50 TPOT and output tokens/s
and the ratios deployctl/guidellm, and exits 1 when P50 TTFT or TPOT differ by more than 15% or output tokens/s
by more than 10% (the tolerances of issue 16). The runtime's own histograms over each tool's runs
(server_ttft_p50, server_tpot_p50, bucket resolution) are the referee: when they differ as much as the tools do,
the server was slower under one tool (its client's CPU cost on the same machine), not measured differently.

Definitions: our TPOT (vLLM's) is (E2E - TTFT) / (output tokens - 1) per request; guidellm calls that
inter_token_latency_ms (its time_per_output_token_ms is latency / output tokens, the first token included), so
that is what ours is compared with. Output tokens/s for guidellm: successful output tokens / benchmark
duration, as ours.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / "bench" / ".venv-guidellm"
GUIDELLM = "guidellm==0.8.1"
TOLERANCE = {"ttft_p50": 0.15, "tpot_p50": 0.15, "output_tok_s": 0.10}


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "runtime"), env.get("PYTHONPATH", "")])
    return env


def ensure_guidellm() -> Path:
    exe = VENV / "bin" / "guidellm"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "torch==2.13.0"], check=True)  # any other torch spec pulls a CUDA build
        subprocess.run([*pip, GUIDELLM], check=True)
    return exe


def serve(model: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = 18000 + os.getpid() % 1000
    proc = subprocess.Popen([sys.executable, "-m", "deployctl_runtime", "serve", "--model", str(model), "--port",
                             str(port), "--device", "cpu", "--max-num-seqs", "16"], cwd=REPO, env=_env(),
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"runtime not ready: {log.read_text()[-2000:]}")


def run_guidellm(exe: Path, url: str, workdir: Path, conc: int, args) -> dict:
    out = workdir / f"guidellm-c{conc}.json"
    # the model name is the model directory's name: guidellm loads its tokenizer from ./tiny (cwd = workdir)
    cmd = [str(exe), "run", "--backend", f"kind=openai_http,target={url},model=tiny,validate_backend=false,http2=false",
           "--profile", f"kind=concurrent,streams={conc}", "--constraint", f"kind=max_requests,count={args.requests}",
           "--data", f"kind=synthetic_text,prompt_tokens={args.prompt_tokens},output_tokens={args.output_tokens}",
           "--tokenizer", "kind=huggingface_auto", "--output", f"kind=json,path={out}", "--disable-console"]
    subprocess.run(cmd, cwd=workdir, check=True, capture_output=True)
    bench = json.loads(out.read_text())["benchmarks"][0]
    m = bench["metrics"]
    return {"ttft_p50": m["time_to_first_token_ms"]["successful"]["median"],
            "tpot_p50": m["inter_token_latency_ms"]["successful"]["median"],
            "output_tok_s": m["output_token_count"]["successful"]["total_sum"] / bench["duration"],
            "prompt_tokens": m["prompt_token_count"]["successful"]["mean"]}


def run_deployctl(url: str, conc: int, words: int, args) -> dict:
    cmd = [sys.executable, "-m", "deployctl", "bench", "--url", url, "--concurrency", str(conc), "--requests",
           str(args.requests), "--input-len", str(words), "--output-len", str(args.output_tokens), "--ignore-eos",
           "--no-loadgen-check", "--json"]
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, check=True)
    (level,) = json.loads(proc.stdout)["levels"]
    return {"ttft_p50": level["median_ttft_ms"], "tpot_p50": level["median_tpot_ms"],
            "output_tok_s": level["output_throughput"],
            "prompt_tokens": level["total_input_tokens"] / max(level["completed"], 1)}


def scrape(url: str):
    from deployctl import promhist

    return promhist.parse_text(httpx.get(url + "/metrics", timeout=10).text)


def server_view(url: str, before) -> dict:
    """The runtime's own P50 TTFT and TPOT (ms, its histograms) over the window since ``before``."""
    from deployctl.bench.server_metrics import window

    w = window(before, scrape(url), "deployctl_runtime_")
    return {"server_ttft_p50": w["ttft_ms"]["p50"], "server_tpot_p50": w["tpot_ms"]["p50"]}


def _mid(a: dict, b: dict) -> dict:
    return {k: (a[k] + b[k]) / 2 for k in a}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=32)
    args = ap.parse_args()
    concs = [int(c) for c in args.concurrency.split(",")]
    exe = ensure_guidellm()
    sys.path[:0] = [str(REPO), str(REPO / "runtime")]
    from deployctl.bench.client import Target
    from deployctl.bench.fit import probe_tokens

    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run([sys.executable, "-m", "deployctl_runtime", "tiny-model", str(work / "tiny")], cwd=REPO,
                       env=_env(), check=True, capture_output=True)
        proc, url = serve(work / "tiny", work / "serve.log")
        try:
            est = probe_tokens(Target(url, model="tiny"), 30.0)
            words = est.words_for(args.prompt_tokens + est.overhead)  # guidellm's prompt excludes the template
            run_deployctl(url, max(concs), words, args)  # warm the runtime up (the first requests are slower)
            print(f"runtime {url}; {est.per_word:g} tokens per prompt word -> --input-len {words}")
            print(f"{'conc':>4} {'metric':>13} {'guidellm':>10} {'deployctl':>10} {'ratio':>7}")
            for conc in concs:
                # ABBA order, the median of each tool's two runs: drift on a shared machine hits both alike
                runs = []
                for tool in ("g", "d", "d", "g"):
                    before = scrape(url)
                    res = run_guidellm(exe, url, work, conc, args) if tool == "g" else run_deployctl(url, conc, words, args)
                    runs.append({**res, **server_view(url, before)})
                g1, d1, d2, g2 = runs
                g, d = _mid(g1, g2), _mid(d1, d2)
                for key in ("ttft_p50", "tpot_p50", "output_tok_s", "prompt_tokens", "server_ttft_p50",
                            "server_tpot_p50"):
                    ratio = d[key] / g[key] if g[key] else float("nan")
                    tol = TOLERANCE.get(key)
                    bad = tol is not None and not abs(ratio - 1) <= tol
                    failed |= bad
                    note = f"  (outside {tol:.0%})" if bad else ""
                    print(f"{conc:>4} {key:>13} {g[key]:>10.2f} {d[key]:>10.2f} {ratio:>6.2f}x{note}")
        finally:
            proc.terminate()
            proc.wait(20)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
