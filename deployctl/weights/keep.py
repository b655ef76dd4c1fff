"""Which model versions a host keeps: those that kept releases use, plus the ``keep_versions`` newest others
(newest by verified_at, then name). One home for the rule: fetch (room before a fetch), ``models prune`` and the
post-deploy prune all call ``versions_to_prune``."""
from __future__ import annotations


def versions_to_prune(listed: list[dict], current: str, in_use: tuple | list = (), keep: int = 2) -> list[str]:
    """Versions to delete from ``listed`` (the host script's list: [{version, partial, verified_at, ...}]):
    never ``current`` nor any in ``in_use``; of the rest, published versions beyond the ``keep`` - 1 newest
    (``current`` counts as one of ``keep``). Partial directories are left alone (a later fetch resumes them)."""
    protected = set(in_use) | {current}
    others = [v for v in listed if not v.get("partial") and v["version"] not in protected]
    others.sort(key=lambda v: (v.get("verified_at") or "", v["version"]), reverse=True)
    room = max(0, keep - 1) if current else keep
    return [v["version"] for v in others[room:]]
