"""`deployctl demo` end to end (README's first command after set-up), timed by step.

Runs ``python -m deployctl demo --workdir NEW_DIR`` ``--runs`` times (default 1) with its default pause, stamps each
progress line as it arrives on stderr and prints how long each step took: set-up (model, host env, nginx), release 1
(first deploy), release 2 (canary at 5% with analysis, promotion), rollback, validate (its functional layer
through nginx), stop. The peer is one runtime start
in the same run (the demo's "ready in X s" lines): the ratio says how many starts' worth the demo takes.

    python bench/bench_demo.py [--runs 1]
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (step name, the progress text that starts it); the demo's own lines (deployctl.demo.run)
STEPS = (("set-up", "demo in "), ("release 1", "release 1: first deploy"), ("release 2", "release 2: canary"),
         ("rollback", "rollback to release 1"), ("validate", "validate: the functional layer"),
         ("stop", "traffic through nginx:"))


def one_run() -> tuple[float, dict, list, str]:
    """(total seconds, {step: seconds}, [runtime start seconds], the demo's summary line)."""
    work = Path(tempfile.mkdtemp(prefix="bench-demo-")) / "demo"
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "deployctl", "demo", "--workdir", str(work)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    marks, starts, lines = {}, [], []
    for line in proc.stderr:
        now = time.monotonic() - t0
        lines.append(line)
        for name, text in STEPS:
            if text in line and name not in marks:
                marks[name] = now
        m = re.search(r"ready in ([\d.]+) s", line)
        if m:
            starts.append(float(m.group(1)))
    out = proc.stdout.read()
    rc = proc.wait()
    total = time.monotonic() - t0
    shutil.rmtree(work.parent, ignore_errors=True)
    if rc != 0:
        raise SystemExit(f"deployctl demo failed ({rc}):\n{''.join(lines)[-3000:]}")
    names = [n for n, _ in STEPS if n in marks]
    steps = {n: (marks[names[i + 1]] if i + 1 < len(names) else total) - marks[n] for i, n in enumerate(names)}
    steps["start-up"] = marks.get("set-up", 0.0)  # interpreter and CLI until the first line
    return total, steps, starts, " ".join(out.split())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    totals, starts = [], []
    for i in range(args.runs):
        total, steps, st, summary = one_run()
        totals.append(total)
        starts += st
        print(f"demo {i + 1}: {total:.1f} s; " + ", ".join(f"{k} {v:.1f} s" for k, v in steps.items()))
        print(f"  {summary}")
    med = statistics.median(totals)
    start = statistics.median(starts) if starts else float("nan")
    print(f"\ndeployctl demo: median {med:.1f} s over {args.runs} run(s) (min {min(totals):.1f}, max {max(totals):.1f});"
          f" one runtime start median {start:.1f} s; ratio demo / start {med / start:.1f}; load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
