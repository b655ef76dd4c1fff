"""The audit trail: one JSON line per runbook step appended to ``<deploy_root>/state/audit.jsonl`` on the host,
through the Host layer, as the step finishes (a run cut short still leaves what it did).

Keys: ts (UTC ISO 8601), run_id, user (who ran it, ``user@machine``), runbook, host, step, check, observed,
expected, ok, detail, recorded (the step's ``record:`` fields), action, result, outcome, dry_run.
"""
from __future__ import annotations

import getpass
import json
import os
import shlex
import socket
from dataclasses import asdict
from datetime import datetime, timezone
from typing import Any

AUDIT_FILE = "audit.jsonl"


def operator() -> str:
    """Who runs deployctl: ``$SUDO_USER`` or the login name, at this machine's hostname."""
    try:
        user = os.environ.get("SUDO_USER") or getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def record(result: Any, *, run_id: str, runbook: str, user: str, dry_run: bool) -> dict[str, Any]:
    """The audit record of one runner.StepResult."""
    data = asdict(result)
    return {"ts": datetime.now(timezone.utc).isoformat(timespec="milliseconds"), "run_id": run_id, "user": user,
            "runbook": runbook, **data, "dry_run": dry_run}


def append(host: Any, state_dir: str, rec: dict[str, Any]) -> None:
    """Append ``rec`` as one line to ``state_dir/audit.jsonl`` on ``host``. Raises RemoteError."""
    line = json.dumps(rec, default=str, separators=(",", ":")) + "\n"
    q = shlex.quote(state_dir)
    host.run(f"mkdir -p {q} && cat >> {q}/{AUDIT_FILE}", input=line, timeout=30)


def read(host: Any, state_dir: str) -> list[dict[str, Any]]:
    """Every audit record on ``host`` (oldest first); none when the file does not exist yet."""
    path = f"{state_dir}/{AUDIT_FILE}"
    if not host.exists(path):
        return []
    return [json.loads(line) for line in host.read_text(path).splitlines() if line.strip()]
