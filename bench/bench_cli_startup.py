"""Start-up time of `deployctl --help` against a minimal 12-command typer app's `--help`.

Both run as fresh interpreters, alternating, N times each; prints the medians and their ratio.
Target (issue: Foundation): ratio <= 1.5.

    python bench/bench_cli_startup.py [--runs 15]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MINIMAL = '''
import typer
app = typer.Typer(add_completion=False)
''' + "".join(f'''
@app.command()
def cmd{i}(name: str = typer.Option("x", help="an option"), flag: bool = False) -> None:
    """Command {i}."""
''' for i in range(12)) + '''
app()
'''


def _time(argv: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with tempfile.TemporaryDirectory() as tmp:
        minimal = Path(tmp) / "minimal_app.py"
        minimal.write_text(MINIMAL)
        base, ours = [], []
        for _ in range(args.runs):
            base.append(_time([sys.executable, str(minimal), "--help"], env))
            ours.append(_time([sys.executable, "-m", "deployctl", "--help"], env))
    b, o = statistics.median(base), statistics.median(ours)
    print(f"minimal 12-command typer app --help: {b * 1000:.0f} ms (median of {args.runs})")
    print(f"deployctl --help:                    {o * 1000:.0f} ms (median of {args.runs})")
    print(f"ratio deployctl / minimal: {o / b:.2f}  (target <= 1.50)")


if __name__ == "__main__":
    main()
