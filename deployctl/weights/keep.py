"""Which model versions a host keeps: those that kept releases use, plus the ``keep_versions`` newest (issue 43:
"the versions kept releases reference plus model.keep_versions"). One home for the rule: the room made before a
fetch, ``models prune`` and the prune after a deploy all call ``versions_to_prune``."""
from __future__ import annotations


def versions_to_prune(listed: list[dict], current: str, in_use: tuple | list = (), keep: int = 2) -> list[str]:
    """Versions to delete from ``listed`` (the host script's list: [{version, partial, verified_at, ...}]): every
    published version except ``current``, those in ``in_use`` and the ``keep`` newest (by verified_at, then
    name). Partial directories are left alone (a later fetch resumes them). Oldest first."""
    published = sorted((v for v in listed if not v.get("partial")),
                       key=lambda v: (v.get("verified_at") or "", v["version"]), reverse=True)
    protected = set(in_use) | {current} | {v["version"] for v in published[:keep]}
    return [v["version"] for v in reversed(published) if v["version"] not in protected]
