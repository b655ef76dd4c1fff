"""``deployctl bench --apply``: the measured knee written into deploy.yaml (comments and layout kept, through
deployctl.config.yamledit): ``engine.max_num_seqs`` = the knee, ``router.max_conns_per_host`` = the router limit
below it (deployctl.bench.recommend), each with a comment saying when and from which run. The edited text is
validated as deploy.yaml before it replaces the file (atomically, same mode); on any error the file is unchanged.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from deployctl.errors import CheckFailed, ConfigError

MARKER = "deployctl bench --apply"  # the comments it writes start with this (a re-run replaces them)


@dataclass(frozen=True)
class Applied:
    """What changed: {dotted key: (old value or None, new value)}; ``notes`` on what was left alone."""

    path: Path
    changes: dict
    notes: tuple[str, ...]


def _current(cfg, dotted: str):
    node = cfg
    for part in dotted.split("."):
        node = getattr(node, part, None) if node is not None else None
    return node


def apply_recommendation(path: Path, rec: dict, *, run: str, when: Optional[datetime] = None) -> Applied:
    """Write ``rec`` (deployctl.bench.recommend.recommendation) into deploy.yaml at ``path``. ``run`` describes the
    bench run for the comment (URL, ladder, requests). Raises ConfigError (exit 3: unreadable or invalid file, or
    the result would be invalid) and CheckFailed (exit 1: no level held, nothing to apply)."""
    from deployctl.config import parse_config
    from deployctl.config.yamledit import comment_above, set_key

    if rec.get("max_num_seqs") is None:
        raise CheckFailed(f"not changing {path}: no level of the bench held, so there is no knee to apply",
                          fix="bench from a lower concurrency (e.g. --concurrency 1,2,4) or with looser SLOs")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}", fix="pass -c with the deploy.yaml to change") from None
    before = parse_config(text, str(path))
    stamp = f"{(when or datetime.now(timezone.utc)):%Y-%m-%d %H:%M} UTC"
    knee = rec["knee_concurrency"]
    wanted = {"engine.max_num_seqs": (rec["max_num_seqs"], f"the knee, where P99 latency still held ({rec['criterion']})")}
    notes = []
    if before.router is not None:
        wanted["router.max_conns_per_host"] = (rec["router"]["max_conns_per_host"],
                                               f"below the knee of {knee}: requests beyond get 429 at the router")
    else:
        notes.append(f"{path} has no router: section; router.max_conns_per_host "
                     f"{rec['router']['max_conns_per_host']} not written")
    changes = {}
    for dotted, (value, why) in wanted.items():
        changes[dotted] = (_current(before, dotted), value)
        try:
            text = set_key(text, dotted, value)
            text = comment_above(text, dotted, f"{MARKER} {stamp}: {why}; from {run} (was {changes[dotted][0]})",
                                 marker=MARKER)
        except ValueError as exc:
            raise ConfigError(f"{path}: cannot set {dotted}: {exc}") from None
    parse_config(text, str(path))  # refuses what deploy.yaml would refuse, before anything changes
    tmp = path.with_name(f".{path.name}.bench-apply")
    tmp.write_text(text, encoding="utf-8")
    os.chmod(tmp, path.stat().st_mode & 0o7777)
    os.replace(tmp, path)
    return Applied(path, changes, tuple(notes))
