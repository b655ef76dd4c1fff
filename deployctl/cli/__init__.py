"""deployctl's command line. The only package that imports typer or rich, prints, or sets exit codes.

Each command group lives in its own module and registers itself on ``app`` when imported here.
Command modules import their lower layers inside the command functions, so `deployctl --help`
stays fast (no torch, no fabric).
"""
from __future__ import annotations

from deployctl.cli._app import app
from deployctl.cli import plan as _plan  # noqa: F401  (registers init, plan)
from deployctl.cli import runbook as _runbook  # noqa: F401  (registers runbook list, show, run)
from deployctl.cli import hosts as _hosts  # noqa: F401  (registers hosts trust, hosts check)
from deployctl.cli import render as _render  # noqa: F401  (registers render)
from deployctl.cli import preflight as _preflight  # noqa: F401  (registers preflight, manifest)
from deployctl.cli import bench as _bench  # noqa: F401  (registers bench)
from deployctl.cli import rollout as _rollout  # noqa: F401  (deploy, promote, abort, rollback, status, history)
from deployctl.cli import demo as _demo  # noqa: F401  (registers demo)
from deployctl.cli import router as _router  # noqa: F401  (registers router reload)
from deployctl.cli import keys as _keys  # noqa: F401  (registers keys add, retire, list)
from deployctl.cli import standby as _standby  # noqa: F401  (registers standby stop)
from deployctl.cli import validate as _validate  # noqa: F401  (registers validate)
from deployctl.cli import scale as _scale  # noqa: F401  (registers scale out, scale in)
from deployctl.cli import autoscale as _autoscale  # noqa: F401  (registers autoscale)
from deployctl.cli import models as _models  # noqa: F401  (registers models fetch, list, prune)


def main() -> None:
    app()
