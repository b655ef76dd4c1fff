"""Shared by the bench tests: the repository root and the environment for subprocesses."""
from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def subprocess_env() -> dict[str, str]:
    """os.environ with both packages on PYTHONPATH and no API keys or proxies leaking in."""
    env = dict(os.environ)
    paths = [str(REPO), str(REPO / "runtime")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    for name in ("DEPLOYCTL_API_KEY", "OPENAI_API_KEY", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        env.pop(name, None)
    return env
