"""Releases: build the runtime wheel, name the release, put it on a host, install it, switch ``current``.

Release id: ``YYYYmmddTHHMMSSZ-<8 hex>``, the UTC time of the deploy and the first 8 hex digits of
sha256(runtime wheel sha256, rendered configuration, model manifest). A release directory is immutable once
written: ``release.json`` records id, created, config hash, model manifest hash, wheel name and sha256, the
deployctl version and ``model_files``: the sha256 of the model directory's tokenizer.json, tokenizer_config.json
(the chat template), generation_config.json and config.json as the first host has them (a file it lacks is left
out), so that a change of template or generation defaults shows beside unchanged weights. ``current`` is switched atomically: a new symlink beside it, then ``mv -T`` (rename(2)) over it.
"""
from __future__ import annotations

import hashlib
import json
import posixpath
import shlex
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

from deployctl import settings
from deployctl.config import DeployConfig
from deployctl.errors import CheckFailed, ConfigError
from deployctl.hostscripts.probe import is_upload_leftover
from deployctl.rollout.leftovers import remove_leftovers
from deployctl.render import config_text, new_release_id
from deployctl.config.layout import (current_link, current_target, engine_links_glob, engines_dir, release_dir,
                                     releases_dir, shared_dir, state_dir)

FAULT_ENV = settings.FAULT_VAR  # copied into the new release's runtime.env when set (fault injection)


@dataclass(frozen=True)
class ReleaseInfo:
    """What release.json holds; model_version/source/dtype/quantization (issue 43) are None without model.source."""

    id: str
    created: str
    config_hash: str
    model_manifest_hash: str
    runtime_wheel: str
    runtime_wheel_sha256: str
    deployctl_version: str
    model_files: dict = field(default_factory=dict)  # MODEL_FILES name -> sha256 (hex)
    model_version: Optional[str] = None
    model_source: Optional[str] = None
    model_dtype: Optional[str] = None
    model_quantization: Optional[str] = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def runtime_source() -> Path:
    """The runtime's source tree (``runtime/`` beside the deployctl package; DEPLOYCTL_RUNTIME_SRC overrides)."""
    src = settings.current().runtime_src or Path(__file__).resolve().parents[2] / "runtime"
    if not (src / "pyproject.toml").is_file():
        raise ConfigError(f"runtime sources not found at {src}",
                          fix="set DEPLOYCTL_RUNTIME_SRC to the runtime/ directory or DEPLOYCTL_RUNTIME_WHEEL to a built wheel")
    return src


def _tree_hash(src: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(src.rglob("*")):
        rel = p.relative_to(src).as_posix()
        if not p.is_file() or any(part in ("build", "__pycache__", "dist") or part.endswith(".egg-info")
                                   for part in p.relative_to(src).parts):
            continue
        h.update(rel.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def build_wheel(cache_dir: Optional[Path] = None) -> Path:
    """The runtime wheel: DEPLOYCTL_RUNTIME_WHEEL if set, else built once per source tree content with
    ``pip wheel --no-deps --no-build-isolation`` into a cache keyed by the sources' hash. Raises CheckFailed."""
    p = settings.current().runtime_wheel
    if p:
        if not p.is_file():
            raise ConfigError(f"DEPLOYCTL_RUNTIME_WHEEL={p}: no such file")
        return p
    src = runtime_source()
    cache = Path(cache_dir or settings.current().cache_dir) / "wheels"
    out = cache / _tree_hash(src)
    found = sorted(out.glob("deployctl_runtime-*.whl")) if out.is_dir() else []
    if found:
        return found[-1]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".build-"))
    with tempfile.TemporaryDirectory() as work:
        # build from a copy so that build/ and *.egg-info never land in the source tree
        subprocess.run(["cp", "-a", str(src), f"{work}/runtime"], check=True)
        for junk in ("build", "dist"):
            subprocess.run(["rm", "-rf", f"{work}/runtime/{junk}"], check=True)
        r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                            "--disable-pip-version-check", "-q", "-w", str(tmp), f"{work}/runtime"],
                           capture_output=True, text=True)
    if r.returncode != 0:
        raise CheckFailed(f"building the runtime wheel from {src} failed: {(r.stderr or r.stdout).strip()[-400:]}")
    try:
        tmp.rename(out)
    except OSError:  # another process built it meanwhile
        subprocess.run(["rm", "-rf", str(tmp)], check=False)
    return sorted(out.glob("deployctl_runtime-*.whl"))[-1]


def wheel_version(wheel: Path) -> str:
    """The version in a wheel's file name (``deployctl_runtime-0.1.0-py3-none-any.whl`` -> ``0.1.0``, PEP 427)."""
    parts = wheel.name.split("-")
    return parts[1] if len(parts) >= 5 else "unknown"


MODEL_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json")


def read_model_files(host, cfg: DeployConfig) -> dict[str, str]:
    """sha256 of each MODEL_FILES file in model.path on ``host`` ({name: hex}; absent files left out), one command."""
    names = " ".join(shlex.quote(n) for n in MODEL_FILES)
    r = host.run(f"cd {shlex.quote(cfg.model.path)} && sha256sum -- {names} 2>/dev/null; true", timeout=60,
                 check=False)
    out = {}
    for line in r.stdout.splitlines():
        digest, _, name = line.partition("  ")
        if name in MODEL_FILES and len(digest) == 64:
            out[name] = digest
    return out


def make_release_info(cfg: DeployConfig, wheel: Path, manifest: str, *, when: Optional[datetime] = None,
                      model_files: Optional[dict] = None) -> ReleaseInfo:
    from deployctl import __version__

    when = when or datetime.now(timezone.utc)
    wheel_sha = _sha256_file(wheel)
    ctext = config_text(cfg)
    return ReleaseInfo(
        id=new_release_id(cfg, runtime_version=wheel_version(wheel), manifest=manifest, when=when),
        created=when.isoformat(timespec="seconds").replace("+00:00", "Z"),
        config_hash=hashlib.sha256(ctext.encode()).hexdigest(),
        model_manifest_hash=hashlib.sha256(manifest.encode()).hexdigest(),
        runtime_wheel=wheel.name,
        runtime_wheel_sha256=wheel_sha,
        deployctl_version=__version__,
        model_files=dict(model_files or {}),
        model_version=cfg.model.version,
        model_source=cfg.model.source,
        model_dtype=cfg.model.dtype,
        model_quantization=cfg.model.quantization,
    )


def read_manifest(host, cfg: DeployConfig) -> str:
    """The model manifest text from the host (model.path/model.manifest). Raises CheckFailed when missing."""
    path = posixpath.join(cfg.model.path, cfg.model.manifest)
    if not host.exists(path):
        raise CheckFailed(f"model manifest {path} not found on {host.name}",
                          fix=f"run `deployctl manifest {cfg.model.path}` on that host")
    return host.read_text(path)


def current_release(host, *, timeout: float = 15) -> Optional[str]:
    """The release id ``current`` points at on ``host``, or None."""
    link = current_link(host.config)
    r = host.run(f"readlink {shlex.quote(link)} 2>/dev/null || true", timeout=timeout)
    target = r.stdout.strip()
    return posixpath.basename(target.rstrip("/")) if target else None


def list_releases(host, *, timeout: float = 15) -> list[str]:
    """The release ids under releases/, oldest first (by time); killed uploads' leftovers are left out."""
    r = host.run(f"ls -1 {shlex.quote(releases_dir(host.config))} 2>/dev/null || true", timeout=timeout)
    return sorted(line.strip() for line in r.stdout.splitlines() if line.strip() and not line.startswith(".")
                  and not is_upload_leftover(line.strip()))


def release_files(info: ReleaseInfo, files: list, platform: Optional[dict] = None) -> list:
    """The rendered files with release.json completed (render's fields plus ``ReleaseInfo`` plus ``platform``: the
    host's driver, CUDA, torch and engine versions from the deploy's preflight, deployctl.preflight.platform_of;
    null when preflight did not run) and manifest.sha256 recomputed to cover the runtime wheel too."""
    from deployctl.render import RenderedFile, release_manifest

    base: dict = {}
    for f in files:
        if f.path == "release.json":
            base = json.loads(f.content)
    kept = [f for f in files if f.path not in ("release.json", "manifest.sha256")]
    doc = {**base, **asdict(info), "platform": platform}
    kept.append(RenderedFile("release.json", json.dumps(doc, indent=1, sort_keys=True) + "\n"))
    return kept + [release_manifest(kept, {info.runtime_wheel: info.runtime_wheel_sha256})]


def tarball(info: ReleaseInfo, wheel: Path, files: list, out: Path, platform: Optional[dict] = None) -> None:
    """Write at ``out`` the tar file ``upload`` sends: the runtime wheel + release_files (deployctl.rollout.diskcheck
    measures it before any upload)."""
    import io
    import tarfile

    fault = settings.current().runtime_fault
    fake_gpu = settings.current().fake_gpu_memory  # tests: the stand-in GPU the runtime accounts its memory in
    with tarfile.open(out, "w") as tar:
        tar.add(str(wheel), arcname=wheel.name)
        for f in release_files(info, files, platform):
            content = f.content
            if fault and posixpath.basename(f.path) == "runtime.env":
                content = content.rstrip("\n") + f"\n{FAULT_ENV}={fault}\n"
            if fake_gpu and posixpath.basename(f.path) == "runtime.env":
                content = content.rstrip("\n") + f"\n{settings.FAKE_GPU_VAR}={fake_gpu}\n"
            data = content.encode()
            ti = tarfile.TarInfo(f.path)
            ti.size, ti.mode, ti.mtime = len(data), f.mode, 0
            tar.addfile(ti, io.BytesIO(data))


# seconds one host's upload may take in a group (the leftovers' 30 s + the put's 300 s + the remote tar/mv calls'
# 30 s and 60 s + slack)
UPLOAD_DEADLINE_S = 450.0


def upload(host, cfg: DeployConfig, info: ReleaseInfo, wheel: Path, files: list, *, timeout: float = 300,
           platform: Optional[dict] = None, on_put=None, removed: Optional[list] = None) -> str:
    """Write the release directory on ``host`` (skipped when a complete one with this id exists): the runtime
    wheel and the rendered files (deployctl.render.RenderedFile; modes kept, runtime.env 0600) with release.json
    and manifest.sha256 completed (``release_files``), sent as one tar file, plus the model's manifest copied on
    the host as model.manifest.sha256 (the weights are never copied). The directory is filled under
    ``<id>.partial`` and renamed into place; leftovers of killed uploads are removed first (remove_leftovers: added
    to ``removed``). ``on_put()`` is called once the tar file is on the host, before it is unpacked. Returns the
    release dir. Raises RemoteError."""
    h = host.config
    rdir = release_dir(h, info.id)
    q = shlex.quote
    tmp = rdir + ".partial"
    (removed if removed is not None else []).extend(remove_leftovers(host))
    with tempfile.TemporaryDirectory() as work:
        tar = Path(work) / "release.tar"
        tarball(info, wheel, files, tar, platform)
        r = host.run(f"test -f {q(posixpath.join(rdir, 'release.json'))} && echo present || "
                     f"mkdir -p {q(releases_dir(h))} {q(state_dir(h))} {q(shared_dir(h, 'logs'))} {q(shared_dir(h, 'run'))}",
                     timeout=30)
        if r.stdout.strip() == "present":
            return rdir
        host.put(tar, rdir + ".tar", mode=0o600, timeout=timeout)
    if on_put is not None:
        on_put()
    manifest = posixpath.join(cfg.model.path, cfg.model.manifest)
    host.run(f"rm -rf {q(tmp)} && mkdir -p {q(tmp)} && tar -xf {q(rdir + '.tar')} -C {q(tmp)} && "
             f"rm -f {q(rdir + '.tar')} && cp {q(manifest)} {q(posixpath.join(tmp, 'model.manifest.sha256'))} && "
             f"rm -rf {q(rdir)} && mv {q(tmp)} {q(rdir)}", timeout=60)
    return rdir


# A foreign engine (release.json engine_distribution) runs from <release>/engine/bin/python: when the host's python
# env already has engine_distribution==engine_version (what preflight checks) a wrapper that execs that python;
# otherwise <release>/engine is a link to the host's one venv of that pinned version,
# <engines_dir>/<dist>-<version> (config/layout.py engines_dir: <deploy_root>/shared/engines, one per machine for
# hosts[].replicas), pip-installed (with its dependencies: vLLM brings
# its torch) by the first release that pins it, under a flock so two releases never install it at once, and
# reused by every later release and rollback that pins the same version (a multi-GB install once per host, not
# per release). `prune` removes a shared venv once no release left on the machine links to it.
ENGINE_INSTALL = """dist=$(awk -F'"' '$2 == "engine_distribution" {{ print $4; exit }}' "$rdir/release.json")
ver=$(awk -F'"' '$2 == "engine_version" {{ print $4; exit }}' "$rdir/release.json")
if [ -n "$dist" ] && [ ! -f "$rdir/engine/.deployctl-installed" ]; then
  have=$(PYTHONPATH= {python} -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$dist" 2>/dev/null || true)
  if [ "$have" = "$ver" ]; then
    rm -rf "$rdir/engine.partial" && mkdir -p "$rdir/engine.partial/bin"
    printf '#!/bin/sh\\nexec %s "$@"\\n' {python} > "$rdir/engine.partial/bin/python"
    chmod 0755 "$rdir/engine.partial/bin/python"
    printf '%s==%s host env\\n' "$dist" "$ver" > "$rdir/engine.partial/.deployctl-installed"
    rm -rf "$rdir/engine" && mv "$rdir/engine.partial" "$rdir/engine"
  else
    envs={engines}; venv="$envs/$dist-$ver"
    mkdir -p "$envs"
    exec 8>>"$envs/.lock"
    flock -w {timeout} 8 || {{ echo "engine: another install into $envs held its lock for {timeout} s" >&2; exit 1; }}
    if [ ! -f "$venv/.deployctl-installed" ]; then
      # built in place (a venv's console scripts name its path), complete only once the marker is written
      echo "engine: installing $dist==$ver into $venv (once per host)" >&2
      rm -rf "$venv" && PYTHONPATH= {python} -m venv "$venv"
      # pip's lines go to stderr as "engine: ...", which deployctl shows as they come (switch_and_install)
      ( set -o pipefail; PYTHONPATH= timeout {timeout} "$venv/bin/python" -m pip install --progress-bar off \
          --disable-pip-version-check "$dist==$ver" 2>&1 | sed -u 's/^/engine: /' >&2 )
      printf '%s==%s own venv, shared\\n' "$dist" "$ver" > "$venv/.deployctl-installed"
      echo engine-installed
    fi
    rm -rf "$rdir/engine" && ln -s "$venv" "$rdir/engine"
    exec 8>&-
  fi
fi"""


def engine_of(host, release_id: str, *, timeout: float = 15) -> tuple:
    """(engine_kind, engine_version) from the release's release.json on ``host``; (None, None) when unreadable
    (releases rendered before engines existed are the bundled runtime's)."""
    path = posixpath.join(release_dir(host.config, release_id), "release.json")
    r = host.run(f"cat {shlex.quote(path)} 2>/dev/null || true", timeout=timeout)
    try:
        info = json.loads(r.stdout)
    except ValueError:
        return None, None
    return info.get("engine_kind") or "deployctl-runtime", info.get("engine_version")


def switch_and_install(host, release_id: str, *, timeout: float = 300,
                       on_progress: Optional[Callable[[str], None]] = None) -> bool:
    """In one remote command: give a foreign engine its pinned version in ``<release>/engine`` (ENGINE_INSTALL;
    first, so that an install that fails or times out leaves ``current`` where it was), point ``current`` at the
    release atomically (``switch_current``), then install its runtime wheel into the host's python env (``pip install --no-deps --force-reinstall --no-index``; the env
    already has torch and the other dependencies). The install runs under ``flock`` on a file in the env
    (``<sys.prefix>/.deployctl-runtime.lock``: hosts sharing one env never install at once) and is skipped when the
    env's ``.deployctl-runtime-installed`` records a wheel with the same sha256 (byte-identical code, which a
    running runtime of another release may be using). ``on_progress`` gets each line of an engine install as it
    comes (pip's "Collecting ...", "Downloading ...", "Successfully installed ..."; a multi-GB vLLM takes
    minutes). Returns whether pip ran. Raises RemoteError."""
    h = host.config
    rdir = release_dir(h, release_id)
    q = shlex.quote
    link = current_link(h)
    script = f"""set -e
rdir={q(rdir)}
test -f "$rdir/release.json" || {{ echo "release {release_id} is not on this host ($rdir)" >&2; exit 3; }}
{ENGINE_INSTALL.format(python=q(h.python), timeout=int(timeout), engines=q(engines_dir(h)))}
ln -sfn {q(current_target(release_id))} {q(link + ".new")} && mv -T {q(link + ".new")} {q(link)}
sha=$(awk -F'"' '$2 == "runtime_wheel_sha256" {{ print $4; exit }}' "$rdir/release.json")
want=${{sha:-{release_id}}}
prefix=$(PYTHONPATH= {q(h.python)} -c 'import sys; print(sys.prefix)')  # not -S: a venv's prefix comes from site
marker="$prefix/.deployctl-runtime-installed"
exec 9>>"$prefix/.deployctl-runtime.lock"
flock -w {int(timeout)} 9
if [ "$(cat "$marker" 2>/dev/null)" = "$want" ]; then echo skipped; exit 0; fi
rm -f "$marker"
cd "$rdir" && PYTHONPATH= {q(h.python)} -m pip install -q --no-deps --force-reinstall --disable-pip-version-check \\
  --no-index deployctl_runtime-*.whl
printf '%s\\n' "$want" > "$marker"
echo installed
"""
    def line(text: str) -> None:
        if text.startswith("engine: "):
            on_progress(text[len("engine: "):])

    r = host.run(["bash", "-c", script], timeout=timeout + 30, on_stderr=line if on_progress else None)
    return "installed" in r.stdout


def clear_current(host, *, timeout: float = 30) -> None:
    """Remove ``current`` (a host that had no release before an aborted deploy serves nothing again, and says so)."""
    host.run(["rm", "-f", current_link(host.config)], timeout=timeout)


def switch_current(host, release_id: str, *, timeout: float = 30) -> None:
    """Point ``current`` at releases/<id> atomically (new link, then rename over the old one)."""
    h = host.config
    link = current_link(h)
    tmp = f"{link}.new"
    target = current_target(release_id)
    q = shlex.quote
    host.run(f"test -f {q(posixpath.join(release_dir(h, release_id), 'release.json'))} && "
             f"ln -sfn {q(target)} {q(tmp)} && mv -T {q(tmp)} {q(link)}", timeout=timeout)


def prune(host, keep: int, protect: set[str], *, timeout: float = 60) -> list[str]:
    """Remove the oldest releases beyond ``keep``, never the current one nor any in ``protect``.
    Returns the removed ids."""
    current = current_release(host)
    names = list_releases(host)
    keep_set = set(names[-keep:]) | set(protect) | ({current} if current else set())
    gone = [n for n in names if n not in keep_set and not n.endswith(".partial")]
    if gone:
        host.run(["rm", "-rf", *[release_dir(host.config, n) for n in gone]], timeout=timeout)
        # shared engine venvs (ENGINE_INSTALL) that no release left on the machine (any replica's) links to;
        # never one being installed
        envs = engines_dir(host.config)
        host.run(["bash", "-c", f"""cd {shlex.quote(envs)} 2>/dev/null || exit 0
exec 8>>.lock; flock -n 8 || exit 0
here=$(pwd -P)
used=$(for l in {engine_links_glob(host.config)}; do [ -L "$l" ] && readlink -f "$l"; done)
for d in */; do d=${{d%/}}; [ -d "$d" ] || continue
  printf '%s\\n' "$used" | grep -qxF "$here/$d" || rm -rf -- "$d"; done"""], timeout=timeout)
    return gone
