"""The audit trail: one JSON line per runbook step appended to ``<deploy_root>/state/audit.jsonl`` on the host,
through the Host layer: after a changing action at once (before anything else happens), the rest when the host's
run ends, however it ends (error, Ctrl-C included), so a run cut short still leaves what it did.

Keys: ts (UTC ISO 8601), run_id, user (who ran it, ``user@machine``), runbook, host, step, check, observed,
expected, ok, detail, recorded (the step's ``record:`` fields), action, result, outcome, dry_run.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import asdict
from datetime import datetime, timezone
from typing import Any

AUDIT_FILE = "audit.jsonl"


def record(result: Any, *, run_id: str, runbook: str, user: str, dry_run: bool) -> dict[str, Any]:
    """The audit record of one runner.StepResult."""
    data = asdict(result)
    return {"ts": datetime.now(timezone.utc).isoformat(timespec="milliseconds"), "run_id": run_id, "user": user,
            "runbook": runbook, **data, "dry_run": dry_run}


def append(host: Any, state_dir: str, records: list[dict[str, Any]]) -> None:
    """Append ``records``, one line each, to ``state_dir/audit.jsonl`` on ``host``. Raises RemoteError."""
    if not records:
        return
    lines = [shlex.quote(json.dumps(r, default=str, separators=(",", ":"))) for r in records]
    q = shlex.quote(state_dir)
    # the lines travel on the command line (printf), not stdin: one exec, no wait for an EOF on the channel
    host.run(f"mkdir -p {q} && printf '%s\\n' {' '.join(lines)} >> {q}/{AUDIT_FILE}", timeout=30)


def read(host: Any, state_dir: str) -> list[dict[str, Any]]:
    """Every audit record on ``host`` (oldest first); none when the file does not exist yet."""
    path = f"{state_dir}/{AUDIT_FILE}"
    if not host.exists(path):
        return []
    return [json.loads(line) for line in host.read_text(path).splitlines() if line.strip()]
