"""Re-render the runtime.yaml of a host's current release after ``adjust`` changed deploy.yaml (deployctl.render),
and keep the release's manifest.sha256 line for it true."""
from __future__ import annotations

import shlex

from deployctl.errors import RemoteError


def rerender_runtime_yaml(t) -> str:
    """Render runtime.yaml for ``t.cfg`` and write it over ``<current>/runtime.yaml`` on the host; the release id
    stays the current one. Returns the path written. Raises RemoteError, ConfigError."""
    from deployctl.render import render_release

    v = t.variables
    path = v["runtime_yaml"]
    res = t.host.run(f"readlink -f {shlex.quote(v['current'])}", timeout=30, check=False)
    release_dir = res.stdout.strip()
    if res.exit_code != 0 or not release_dir or not t.host.exists(path):
        raise RemoteError(f"{t.host_cfg.name}: no current release under {v['deploy_root']}; nothing to re-render",
                          fix="install a release first (`deployctl deploy`)")
    release_id = release_dir.rsplit("/", 1)[-1]
    files = {f.path: f for f in render_release(t.cfg, t.host_cfg, release_id, api_key=None)}
    rendered = files["runtime.yaml"]
    t.host.put_text(rendered.content, path, mode=rendered.mode)
    manifest = f"{release_dir}/manifest.sha256"
    if t.host.exists(manifest):
        lines = [f"{rendered.sha256}  runtime.yaml" if line.endswith("  runtime.yaml") else line
                 for line in t.host.read_text(manifest).splitlines()]
        t.host.put_text("\n".join(lines) + "\n", manifest)
    return path
