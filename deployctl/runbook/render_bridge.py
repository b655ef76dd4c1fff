"""Re-render the runtime.yaml of a host's current release after ``adjust`` changed deploy.yaml."""
from __future__ import annotations

import yaml

from deployctl.errors import RemoteError


def rerender_runtime_yaml(t, changed: list[str]) -> str:
    """Write the deploy.yaml keys ``changed`` (``engine.X``, ``server.max_queued_requests``), as ``t.cfg`` now has
    them, into ``<current>/runtime.yaml`` on the host (serve flags as keys, dashes → underscores, as the runtime
    reads them). Returns the path written. Raises RemoteError."""
    path = t.variables["runtime_yaml"]
    if not t.host.exists(path):
        raise RemoteError(f"{t.host_cfg.name}: {path} is missing; nothing to re-render", fix="install a release first")
    data = yaml.safe_load(t.host.read_text(path)) or {}
    for dotted in changed:
        section, _, key = dotted.partition(".")
        data[key] = getattr(getattr(t.cfg, section), key)
    t.host.put_text(yaml.safe_dump(data, sort_keys=False), path)
    return path
