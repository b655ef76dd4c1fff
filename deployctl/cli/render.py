"""`deployctl render`: every rendered file for every host, validated by the tools that read them."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from deployctl.cli.params import CONFIG, JSON
from deployctl.cli._app import app, err_console, print_json
from deployctl.errors import UsageError


@app.command(epilog="Example: deployctl render --out out/ --target systemd")
def render(
    out: Path = typer.Option(..., "--out", "-o", help="Directory to write the rendered files to."),
    target: str = typer.Option("systemd", "--target", "-t", help="systemd, container, k8s or k8s-rollout."),
    config: Path = CONFIG,
    release_id: Optional[str] = typer.Option(None, "--release-id",
                                             help="Release id (default: UTC timestamp + short content hash)."),
    no_validate: bool = typer.Option(False, "--no-validate", help="Skip systemd-analyze, nginx -t, promtool, "
                                     "kubernetes-validate and the CRD schema checks."),
    as_json: bool = JSON,
) -> None:
    """Render the release (unit, runtime.yaml, 0600 env file, launcher), router, container or k8s files and alert
    rules into OUT; byte-for-byte the same for the same inputs and --release-id. Exit 1 when a check fails."""
    import json

    from deployctl.config import load_config
    from deployctl.render import render_all
    from deployctl.render.validate import validate_tree

    cfg = load_config(config)
    from deployctl import settings

    key_env = cfg.server.api_key_env
    key_missing = bool(key_env) and not settings.environ().get(key_env)
    try:
        paths = render_all(cfg, out, target=target, release_id=release_id, missing_key_ok=True)
    except OSError as exc:  # writing under --out (a file, no permission, read-only filesystem)
        if exc.filename is not None and not str(exc.filename).startswith(str(out)):
            raise
        raise UsageError(f"--out {out}: cannot write {exc.filename or out}: {exc.strerror}",
                         fix="pass a directory that exists or can be created (not a file)") from None
    release = json.loads((out / "RENDER.json").read_text())["release_id"]
    results = [] if no_validate else validate_tree(cfg, out)
    failed = [r for r in results if not r.ok]
    if as_json:
        print_json({"release_id": release, "target": target, "out": str(out),
                    "files": [str(p.relative_to(out)) for p in paths],
                    "checks": [{"tool": r.tool, "path": r.path, "ok": r.ok, "output": r.output, "notes": list(r.notes)}
                               for r in results]})
    else:
        for r in results:
            mark = "[green]ok[/]" if r.ok else "[bold red]FAILED[/]"
            err_console.print(f"{mark} {r.tool} {r.path}", markup=True, highlight=False)
            if not r.ok:
                err_console.print(r.output, markup=False, highlight=False)
            for note in r.notes:
                err_console.print(f"  note: {note}", markup=False, highlight=False)
        err_console.print(f"release {release}: {len(paths)} files in {out} ({target})")
    if key_missing:  # C33: render works without the secret; say where it goes
        err_console.print(f"note: {key_env} is not set: the runtime.env files carry a comment naming it instead of "
                          f"the API key; export {key_env} and render again for files that start as they are "
                          "(`deployctl deploy` reads it when it uploads)", markup=False, highlight=False)
    if failed:
        err_console.print(f"[bold red]error:[/] {len(failed)} rendered file(s) failed validation: "
                          + ", ".join(r.path for r in failed), markup=True)
        raise typer.Exit(1)
