"""What the fleet benches share (bench_rollback, bench_scale, bench_interrupt): run the CLI on a deploy.yaml, and
kill every runtime a loopback fleet left running under its deploy roots."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterable

ROOT = Path(__file__).resolve().parent.parent


def cli(path: Path, *args: str, env: dict) -> subprocess.CompletedProcess:
    """``deployctl ARGS -c PATH`` with ``env`` over this process's environment; exits naming the command and its
    output tails when it fails."""
    r = subprocess.run([sys.executable, "-m", "deployctl", *args, "-c", str(path)], capture_output=True, text=True,
                       timeout=600, env={**os.environ, **env}, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"`deployctl {' '.join(args)}` failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-3000:]}")
    return r


def kill_runtimes(deploy_roots: Iterable[Path]) -> None:
    """SIGKILL the process group of every ``shared/run/runtime*.pid`` under the given deploy roots."""
    for root in deploy_roots:
        run = Path(root) / "shared" / "run"
        for pidfile in run.glob("runtime*.pid") if run.is_dir() else ():
            try:
                os.killpg(int(pidfile.read_text().split()[0]), signal.SIGKILL)
            except (OSError, ValueError):
                pass
