"""`deployctl demo`."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Optional

import typer

from deployctl.cli._app import app, out_console


@app.command(epilog="Example: deployctl demo --keep --workdir /tmp/demo1")
def demo(
    workdir: Optional[Path] = typer.Option(None, "--workdir", help="Where to put the model, hosts and nginx (default: a new temp dir)."),
    keep: bool = typer.Option(False, "--keep", help="Leave the runtimes and nginx running at the end."),
    pause: float = typer.Option(10.0, "--pause", help="Seconds of canary analysis at 5%."),
) -> None:
    """The main job end to end on this machine: deploy, canary 5% with analysis, promote, rollback."""
    from deployctl.cli.rollout import progress_printer
    from deployctl.demo.run import run_demo

    from deployctl.errors import UsageError

    if workdir is not None and workdir.exists() and any(workdir.iterdir()):
        # a second demo in the same folder would pick new ports beside the first one's releases and nginx
        raise UsageError(f"--workdir {workdir} is not empty", fix="give an empty or new folder, or leave --workdir out")
    work = workdir or Path(tempfile.mkdtemp(prefix="deployctl-demo-"))
    r = run_demo(work, progress=progress_printer, keep=keep, pause_s=pause)
    total = sum(r.canary_split.values())
    share = r.canary_split.get(r.release_2, 0) / total if total else 0.0
    out_console.print(f"demo done: release 1 {r.release_1}, release 2 {r.release_2}; at 5% release 2 answered "
                      f"{share:.1%} of {total} requests; rollback took {r.rollback_s:.1f} s; "
                      f"failed requests: {sum(r.failures.values())}", markup=False)
