"""A stand-in for one GPU's memory, shared by processes through a file: tests of GPU memory rules on CPU.

``DEPLOYCTL_FAKE_GPU_MEMORY=/path/ledger.json`` makes the runtime account its device memory there (weights + KV
pool at start, a residue while asleep, the full amount again at a wake) and refuse what does not fit, as a real
GPU's allocator would (CUDA out of memory). deployctl's host probe (deployctl/hostscripts/probe.py) reads the same
file for the host's GPU memory used/free. Only the GPU is mocked: processes, sleeps and wakes are real.

File format (JSON, written atomically under an ``fcntl.flock`` on ``<path>.lock``):
``{"total_bytes": int, "residue_bytes": int (what a sleeping process keeps; default 512 MiB),
"allocations": {"<pid>": {"bytes": int, "what": str, "label": str}}}``. Allocations of processes that no longer
exist are dropped on every update (a killed runtime frees its memory, as the driver does).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

ENV_VAR = "DEPLOYCTL_FAKE_GPU_MEMORY"
DEFAULT_RESIDUE_BYTES = 512 * 2**20


class GpuMemoryExhausted(Exception):
    """The ledger has no room: ``needed``, ``free`` bytes, and ``holders`` ("pid 123 (weights+kv 4096 bytes)")."""

    def __init__(self, needed: int, free: int, total: int, holders: list[str], what: str):
        self.needed, self.free, self.total, self.holders = needed, free, total, holders
        held = "; ".join(holders) or "nobody"
        super().__init__(f"CUDA out of memory (fake GPU {ENV_VAR}): {what} needs {needed} bytes, {free} of {total} "
                         f"bytes free; held by {held}")


def _alive(pid: int) -> bool:
    """PID exists and is not a zombie: an exited process that its parent has not reaped yet holds no device memory
    (the driver frees it at exit), so its allocation is dropped. State from /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    except OSError:  # another user's /proc entry we cannot read: it exists
        return True
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X", "")


@dataclass
class Ledger:
    """One process's view of the ledger file at ``path``; ``pid`` is the owner of this process's allocation."""

    path: Path
    pid: int = 0

    @classmethod
    def from_env(cls, env: Optional[dict] = None) -> Optional["Ledger"]:
        """The ledger named by DEPLOYCTL_FAKE_GPU_MEMORY, or None when it is unset (a real device)."""
        value = (os.environ if env is None else env).get(ENV_VAR)
        return cls(Path(value), os.getpid()) if value else None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict]:
        lock = self.path.with_name(self.path.name + ".lock")
        with open(lock, "a+") as fd:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                try:
                    data = json.loads(self.path.read_text())
                except FileNotFoundError:
                    raise ValueError(f"{ENV_VAR}={self.path}: no such file; write "
                                     '{"total_bytes": N} there first') from None
                except ValueError as exc:
                    raise ValueError(f"{ENV_VAR}={self.path}: not JSON ({exc})") from None
                if not isinstance(data.get("total_bytes"), int) or data["total_bytes"] <= 0:
                    raise ValueError(f"{ENV_VAR}={self.path}: total_bytes must be a positive integer")
                allocs = data.setdefault("allocations", {})
                for pid in [p for p in allocs if not _alive(int(p))]:
                    del allocs[pid]
                yield data
                tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
                os.replace(tmp, self.path)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    @property
    def residue_bytes(self) -> int:
        with self._locked() as data:
            return int(data.get("residue_bytes", DEFAULT_RESIDUE_BYTES))

    def held(self) -> int:
        """Bytes this process holds in the ledger now (0 when it holds nothing)."""
        with self._locked() as data:
            return int(data["allocations"].get(str(self.pid), {}).get("bytes", 0))

    def set(self, num_bytes: int, what: str, label: str = "") -> None:
        """Make this process hold ``num_bytes`` (replacing what it held). Raises GpuMemoryExhausted when the others
        leave less than that free (nothing changes then), ValueError for a missing or bad ledger file."""
        key = str(self.pid)
        with self._locked() as data:
            allocs = data["allocations"]
            others = {p: a for p, a in allocs.items() if p != key}
            free = data["total_bytes"] - sum(int(a["bytes"]) for a in others.values())
            mine = int(allocs.get(key, {}).get("bytes", 0))
            if num_bytes > mine and num_bytes > free:
                holders = [f"pid {p} ({a.get('what', '?')} {a['bytes']} bytes{', ' + a['label'] if a.get('label') else ''})"
                           for p, a in sorted(others.items())]
                raise GpuMemoryExhausted(num_bytes, free, data["total_bytes"], holders, what)
            allocs[key] = {"bytes": int(num_bytes), "what": what, "label": label}

    def release(self) -> None:
        """Drop this process's allocation (at exit)."""
        with contextlib.suppress(ValueError, OSError):
            with self._locked() as data:
                data["allocations"].pop(str(self.pid), None)


def usage(path: str | Path) -> dict:
    """{"total_bytes", "used_bytes", "free_bytes", "allocations"} of the ledger (read without the lock; for tests)."""
    data = json.loads(Path(path).read_text())
    allocs = {p: a for p, a in data.get("allocations", {}).items() if _alive(int(p))}
    used = sum(int(a["bytes"]) for a in allocs.values())
    return {"total_bytes": data["total_bytes"], "used_bytes": used, "free_bytes": data["total_bytes"] - used,
            "allocations": allocs}
