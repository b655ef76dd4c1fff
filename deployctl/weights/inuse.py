"""The model versions the releases kept on a host use (release.json's model_version; issue 43): what keeps a
model version from being pruned."""
from __future__ import annotations

import json
import shlex
from typing import Optional

from deployctl.config.layout import releases_dir


def release_model_versions(host, *, timeout: float = 15) -> dict[str, Optional[str]]:
    """{release id: the model_version its release.json names (None: none)} for every release kept on ``host``."""
    rdir = releases_dir(host.config)
    r = host.run(f"cd {shlex.quote(rdir)} 2>/dev/null && for d in *; do [ -f \"$d/release.json\" ] && "
                 f"printf '%s\\t' \"$d\" && tr -d '\\n' < \"$d/release.json\" && echo; done; true", timeout=timeout)
    out: dict[str, Optional[str]] = {}
    for line in r.stdout.splitlines():
        rid, _, body = line.partition("\t")
        try:
            out[rid] = json.loads(body).get("model_version")
        except ValueError:
            continue
    return out
