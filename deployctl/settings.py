"""deployctl's own process environment, read in this one place and validated together.

``current()`` -> ``Settings``: every ``DEPLOYCTL_*`` variable below, parsed; the CLI's ``main()`` calls it before
any command runs, so a bad value is one line naming the variable and exit 2 (``UsageError``), never a traceback
half-way through a rollout. It re-reads only when one of these variables changed (tests set them per test).

| variable                    | meaning                                                     | default                        |
| DEPLOYCTL_KNOWN_HOSTS       | deployctl-managed known_hosts file                          | ~/.config/deployctl/known_hosts |
| DEPLOYCTL_SSH_CONFIG        | ssh_config file to read instead of ~/.ssh/config (ssh -F)   | none                           |
| DEPLOYCTL_TEMPLATES         | folder whose templates override the shipped ones            | none                           |
| DEPLOYCTL_RUNBOOKS_PATH     | ``:``-separated folders of the operator's own runbooks      | none                           |
| DEPLOYCTL_CACHE             | cache folder (built runtime wheels)                         | ~/.cache/deployctl             |
| DEPLOYCTL_STATE             | control-machine state: rollout journals, detached runners' logs | ~/.local/state/deployctl   |
| DEPLOYCTL_RUNTIME_SRC       | the runtime's source tree to build the wheel from           | runtime/ beside deployctl      |
| DEPLOYCTL_RUNTIME_WHEEL     | a built runtime wheel to ship instead                       | none                           |
| DEPLOYCTL_LOCK_MAX_AGE_S    | seconds without a heartbeat after which a deploy's lock counts as stale (its holder refreshes it every quarter of this, at most every 60 s) | 600 |
| DEPLOYCTL_VERIFY_TIMEOUT_S  | seconds a start may take before verification fails          | server.startup_timeout_s       |
| DEPLOYCTL_SKIP_PREFLIGHT    | 1: deploy skips its preflight gate                          | 0                              |
| DEPLOYCTL_RUNTIME_FAULT     | copied into a new release's runtime.env (fault injection)   | none                           |
| DEPLOYCTL_CRD_SCHEMAS       | folder whose node_modules/ holds the CRD schema packages    | the copy inside deployctl      |
| DEPLOYCTL_FAKE_GPU_MEMORY   | test-only stand-in GPU ledger: copied into a new release's runtime.env, read by the host probe | none |
| DEPLOYCTL_DETACH            | how `deploy --detach` starts its runner: `auto` (a systemd transient unit where systemd runs, else a daemonized process), `systemd`, `process` | auto |
| DEPLOYCTL_TRACE_REMOTE      | a file to append one JSON line per remote command to: host, seconds, exit code, the command (profiling a fleet step) | none |
| DEPLOYCTL_TEST_KILL_AT      | test-only: SIGKILL this process right after writing a rollout journal record: its N-th, or the first named ``KIND[:STEP]`` (crash tests) | none |
| DEPLOYCTL_TEST_STOP_AT      | test-only: SIGSTOP this process right after writing a rollout journal record: its N-th, or the first named ``KIND[:STEP]`` (fencing tests) | none |

Also here: ``operator()`` (who runs deployctl: ``$SUDO_USER`` or the login name, at this machine) and
``secret(name)`` (the value of a variable that deploy.yaml or a flag names, e.g. ``server.api_key_env``).
The scripts in deployctl/hostscripts/ run on hosts without deployctl and read their own (DEPLOYCTL_HASH_CACHE).
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional

from deployctl.errors import UsageError

PREFIX = "DEPLOYCTL_"
FAULT_VAR = "DEPLOYCTL_RUNTIME_FAULT"
FAKE_GPU_VAR = "DEPLOYCTL_FAKE_GPU_MEMORY"  # runtime/deployctl_runtime/gpu_ledger.py
RUNBOOKS_PATH_VAR = "DEPLOYCTL_RUNBOOKS_PATH"


def _path(name: str, raw: str) -> Path:
    return Path(raw).expanduser()


def _seconds(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise UsageError(f"${name}={raw!r} is not a number of seconds above 0",
                         fix=f"set it to e.g. {name}=600, or unset it")
    return value


def _flag(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise UsageError(f"${name}={raw!r} is not 1 or 0", fix=f"set {name}=1 (or 0), or unset it")


def _paths(name: str, raw: str) -> tuple[Path, ...]:
    return tuple(Path(p).expanduser() for p in raw.split(os.pathsep) if p)


def _choice(name: str, raw: str, choices: tuple[str, ...]) -> str:
    if raw not in choices:
        raise UsageError(f"{name}={raw!r} is not one of {', '.join(choices)}", fix=f"set {name} to one of them or unset it")
    return raw


def _text(name: str, raw: str) -> str:
    return raw


@dataclass(frozen=True)
class Settings:
    """The parsed variables (see the module table). Paths are expanded (``~``); seconds are floats > 0."""

    known_hosts: Path
    ssh_config: Optional[Path]
    templates: Optional[Path]
    runbooks_path: tuple[Path, ...]
    cache_dir: Path
    runtime_src: Optional[Path]
    runtime_wheel: Optional[Path]
    lock_max_age_s: float
    verify_timeout_s: Optional[float]
    skip_preflight: bool
    runtime_fault: Optional[str]
    crd_schemas: Optional[Path] = None
    fake_gpu_memory: Optional[str] = None
    state_dir: Path = Path("~/.local/state/deployctl").expanduser()
    test_kill_at: Optional[str] = None
    test_stop_at: Optional[str] = None
    trace_remote: Optional[Path] = None
    detach: str = "auto"


# field -> (variable, parser, default when unset or empty)
_FIELDS: dict[str, tuple[str, Callable[[str, str], object], object]] = {
    "known_hosts": ("DEPLOYCTL_KNOWN_HOSTS", _path, Path("~/.config/deployctl/known_hosts").expanduser()),
    "ssh_config": ("DEPLOYCTL_SSH_CONFIG", _path, None),
    "templates": ("DEPLOYCTL_TEMPLATES", _path, None),
    "runbooks_path": (RUNBOOKS_PATH_VAR, _paths, ()),
    "cache_dir": ("DEPLOYCTL_CACHE", _path, Path("~/.cache/deployctl").expanduser()),
    "runtime_src": ("DEPLOYCTL_RUNTIME_SRC", _path, None),
    "runtime_wheel": ("DEPLOYCTL_RUNTIME_WHEEL", _path, None),
    "lock_max_age_s": ("DEPLOYCTL_LOCK_MAX_AGE_S", _seconds, 600.0),
    "verify_timeout_s": ("DEPLOYCTL_VERIFY_TIMEOUT_S", _seconds, None),
    "skip_preflight": ("DEPLOYCTL_SKIP_PREFLIGHT", _flag, False),
    "runtime_fault": (FAULT_VAR, _text, None),
    "crd_schemas": ("DEPLOYCTL_CRD_SCHEMAS", _path, None),
    "fake_gpu_memory": (FAKE_GPU_VAR, _text, None),
    "state_dir": ("DEPLOYCTL_STATE", _path, Path("~/.local/state/deployctl").expanduser()),
    "test_kill_at": ("DEPLOYCTL_TEST_KILL_AT", _text, None),
    "test_stop_at": ("DEPLOYCTL_TEST_STOP_AT", _text, None),
    "trace_remote": ("DEPLOYCTL_TRACE_REMOTE", _path, None),
    "detach": ("DEPLOYCTL_DETACH", lambda var, raw: _choice(var, raw, ("auto", "systemd", "process")), "auto"),
}
VARIABLES = tuple(var for var, _, _ in _FIELDS.values())


def load(environ: Mapping[str, str]) -> Settings:
    """Parse ``environ``. Raises UsageError (exit 2) naming the first variable with a bad value."""
    values = {}
    for field_name, (var, parse, default) in _FIELDS.items():
        raw = environ.get(var)
        values[field_name] = default if raw is None or raw == "" else parse(var, raw)
    return Settings(**values)


_cache: dict[str, object] = {}
_lock = threading.Lock()


def current() -> Settings:
    """The settings of this process's environment now (parsed again only after a variable changed).
    Raises UsageError (exit 2) for a bad value."""
    key = tuple(os.environ.get(var) for var in VARIABLES)
    with _lock:
        if _cache.get("key") != key:
            _cache["settings"] = load(os.environ)
            _cache["key"] = key
        return _cache["settings"]  # type: ignore[return-value]


def secret(name: str) -> Optional[str]:
    """The value of environment variable ``name`` (one deploy.yaml or a flag names: API key, sudo password), or
    None when unset."""
    return os.environ.get(name)


def columns_set() -> bool:
    """Whether $COLUMNS gives the terminal's width (rich reads it); without it and a tty, tables get 200 columns."""
    return bool(os.environ.get("COLUMNS"))


def environ() -> Mapping[str, str]:
    """This process's environment, for checks that look up variables deploy.yaml names (read-only use)."""
    return os.environ


def operator() -> str:
    """Who runs deployctl, ``user@machine``: ``$SUDO_USER`` (the person behind sudo) or the login name, else
    ``$USER``, else the uid. Recorded as the rollout's owner, a control command's ``by``, a history entry's and an
    audit record's ``user``."""
    import getpass
    import socket

    try:
        user = os.environ.get("SUDO_USER") or getpass.getuser()
    except Exception:  # no passwd entry (containers)
        user = os.environ.get("USER") or str(os.getuid())
    return f"{user}@{socket.gethostname()}"
