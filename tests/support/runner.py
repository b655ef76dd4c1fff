"""A process whose command line is a detached runner's (``.../deployctl deploy ... --runner SERVICE``) running any
Python code: for the tests of deployctl.rollout.procs and detach's watch, which tell a runner from a stranger that
got its pid by the command line alone."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def runner_like(tmp: Path, service: str, code: str, **popen) -> subprocess.Popen:
    """Start ``code`` as ``python TMP/bin/deployctl deploy -c deploy.yaml --yes --runner SERVICE``."""
    script = tmp / "bin" / "deployctl"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(code)
    return subprocess.Popen([sys.executable, str(script), "deploy", "-c", "deploy.yaml", "--yes", "--runner", service],
                            **popen)
