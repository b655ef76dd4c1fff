"""Weight-verification throughput: deployctl.hostscripts.weights (parallel, streamed hashlib) against coreutils
`sha256sum` hashing the same files one after another, in the same run; then the warm-cache re-check.

    PYTHONPATH=. python bench/bench_hashing.py [--size-gb 2] [--files 8] [--dir /tmp]

Prints both times, the ratio (target: parallel <= 0.4 x sequential sha256sum) and the re-check time of an
unchanged model with a warm hash cache (target: < 1 s). Files are read once before timing so that both
tools hash from the page cache (the disk is not what is measured).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from deployctl.hostscripts.weights import HashCache, verify  # noqa: E402


def make_files(root: Path, total_bytes: int, n: int) -> list[Path]:
    block = os.urandom(64 * 2**20)
    per_file = total_bytes // n
    paths = []
    for i in range(n):
        p = root / f"model-{i + 1:05d}-of-{n:05d}.bin"
        with open(p, "wb") as f:
            left = per_file
            while left > 0:
                chunk = block[: min(left, len(block))]
                f.write(bytes([i]) + chunk[1:])  # distinct files
                left -= len(chunk)
        paths.append(p)
    return paths


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gb", type=float, default=2.0)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--dir", default=None, help="where to write the files (default: a temp dir)")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each; the best is reported")
    args = ap.parse_args()
    if shutil.which("sha256sum") is None:
        print("sha256sum (coreutils) is not installed", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="bench-hashing-", dir=args.dir))
    try:
        total = int(args.size_gb * 1e9)
        paths = make_files(root, total, args.files)
        nbytes = sum(p.stat().st_size for p in paths)
        for p in paths:  # into the page cache
            with open(p, "rb") as f:
                while f.read(16 * 2**20):
                    pass
        seq = []
        for _ in range(args.repeat):
            t, proc = timed(lambda: subprocess.run(["sha256sum", *[p.name for p in paths]], cwd=root,
                                                   capture_output=True, text=True, check=True))
            seq.append(t)
        (root / "manifest.sha256").write_text(proc.stdout)
        par, one = [], []
        for _ in range(args.repeat):
            t, rep = timed(lambda: verify(root, cache=None))
            assert rep.ok and rep.files_hashed == len(paths), rep.issues
            par.append(t)
            t, rep = timed(lambda: verify(root, cache=None, max_workers=1))
            one.append(t)
        cache = root.parent / (root.name + "-cache.json")
        verify(root, cache=HashCache(cache))
        warm_t, warm = timed(lambda: verify(root, cache=HashCache(cache)))
        assert warm.ok and warm.files_hashed == 0 and warm.files_cached == len(paths)
        cache.unlink(missing_ok=True)
        gb = nbytes / 1e9
        t_seq, t_par, t_one = min(seq), min(par), min(one)
        print(f"files: {len(paths)} x {nbytes / len(paths) / 2**20:.0f} MiB = {gb:.2f} GB; cpus: {os.cpu_count()}; "
              f"load average: {os.getloadavg()[0]:.1f}")
        print(f"sha256sum, sequential:          {t_seq:6.2f} s  {gb / t_seq:5.2f} GB/s")
        print(f"deployctl, 1 thread:            {t_one:6.2f} s  {gb / t_one:5.2f} GB/s")
        print(f"deployctl, parallel:            {t_par:6.2f} s  {gb / t_par:5.2f} GB/s")
        print(f"ratio parallel / sha256sum:     {t_par / t_seq:6.3f}  (target <= 0.4)")
        print(f"warm-cache re-check:            {warm_t * 1000:6.1f} ms for {len(paths)} files (target < 1 s)")
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
