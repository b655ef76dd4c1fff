"""Releases: build the runtime wheel, name the release, put it on a host, install it, switch ``current``.

Release id: ``YYYYmmddTHHMMSSZ-<8 hex>``, the UTC time of the deploy and the first 8 hex digits of
sha256(runtime wheel sha256, rendered configuration, model manifest). A release directory is immutable once
written: ``release.json`` records id, created, config hash, model manifest hash, wheel name and sha256 and the
deployctl version. ``current`` is switched atomically: a new symlink beside it, then ``mv -T`` (rename(2)) over it.
"""
from __future__ import annotations

import hashlib
import json
import posixpath
import shlex
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from deployctl import settings
from deployctl.config import DeployConfig
from deployctl.errors import CheckFailed, ConfigError
from deployctl.render import config_text, new_release_id
from deployctl.config.layout import current_link, current_target, release_dir, releases_dir, shared_dir, state_dir

FAULT_ENV = settings.FAULT_VAR  # copied into the new release's runtime.env when set (fault injection)


@dataclass(frozen=True)
class ReleaseInfo:
    """What release.json holds."""

    id: str
    created: str
    config_hash: str
    model_manifest_hash: str
    runtime_wheel: str
    runtime_wheel_sha256: str
    deployctl_version: str

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


def make_release_info(cfg: DeployConfig, wheel: Path, manifest: str, *, when: Optional[datetime] = None) -> ReleaseInfo:
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
    r = host.run(f"ls -1 {shlex.quote(releases_dir(host.config))} 2>/dev/null || true", timeout=timeout)
    return sorted(line.strip() for line in r.stdout.splitlines() if line.strip() and not line.startswith("."))


def release_files(info: ReleaseInfo, files: list) -> list:
    """The rendered files with release.json completed (render's fields plus ``ReleaseInfo``) and
    manifest.sha256 recomputed to cover the runtime wheel too."""
    from deployctl.render import RenderedFile, release_manifest

    base: dict = {}
    for f in files:
        if f.path == "release.json":
            base = json.loads(f.content)
    kept = [f for f in files if f.path not in ("release.json", "manifest.sha256")]
    kept.append(RenderedFile("release.json", json.dumps({**base, **asdict(info)}, indent=1, sort_keys=True) + "\n"))
    return kept + [release_manifest(kept, {info.runtime_wheel: info.runtime_wheel_sha256})]


def _tarball(info: ReleaseInfo, wheel: Path, files: list, out: Path) -> None:
    import io
    import tarfile

    fault = settings.current().runtime_fault
    with tarfile.open(out, "w") as tar:
        tar.add(str(wheel), arcname=wheel.name)
        for f in release_files(info, files):
            content = f.content
            if fault and posixpath.basename(f.path) == "runtime.env":
                content = content.rstrip("\n") + f"\n{FAULT_ENV}={fault}\n"
            data = content.encode()
            ti = tarfile.TarInfo(f.path)
            ti.size, ti.mode, ti.mtime = len(data), f.mode, 0
            tar.addfile(ti, io.BytesIO(data))


def upload(host, cfg: DeployConfig, info: ReleaseInfo, wheel: Path, files: list, *, timeout: float = 300) -> str:
    """Write the release directory on ``host`` (skipped when a complete one with this id exists): the runtime
    wheel and the rendered files (deployctl.render.RenderedFile; modes kept, runtime.env 0600) with release.json
    and manifest.sha256 completed (``release_files``), sent as one tar file, plus the model's manifest copied on
    the host as model.manifest.sha256 (the weights are never copied). The directory is filled under
    ``<id>.partial`` and renamed into place. Returns the release dir. Raises RemoteError."""
    h = host.config
    rdir = release_dir(h, info.id)
    q = shlex.quote
    tmp = rdir + ".partial"
    with tempfile.TemporaryDirectory() as work:
        tar = Path(work) / "release.tar"
        _tarball(info, wheel, files, tar)
        r = host.run(f"test -f {q(posixpath.join(rdir, 'release.json'))} && echo present || "
                     f"mkdir -p {q(releases_dir(h))} {q(state_dir(h))} {q(shared_dir(h, 'logs'))} {q(shared_dir(h, 'run'))}",
                     timeout=30)
        if r.stdout.strip() == "present":
            return rdir
        host.put(tar, rdir + ".tar", mode=0o600, timeout=timeout)
    manifest = posixpath.join(cfg.model.path, cfg.model.manifest)
    host.run(f"rm -rf {q(tmp)} && mkdir -p {q(tmp)} && tar -xf {q(rdir + '.tar')} -C {q(tmp)} && "
             f"rm -f {q(rdir + '.tar')} && cp {q(manifest)} {q(posixpath.join(tmp, 'model.manifest.sha256'))} && "
             f"rm -rf {q(rdir)} && mv {q(tmp)} {q(rdir)}", timeout=60)
    return rdir


def switch_and_install(host, release_id: str, *, timeout: float = 300) -> bool:
    """In one remote command: point ``current`` at the release atomically (``switch_current``), then install
    its runtime wheel into the host's python env (``pip install --no-deps --force-reinstall --no-index``; the env
    already has torch and the other dependencies). The install runs under ``flock`` on a file in the env
    (``<sys.prefix>/.deployctl-runtime.lock``: hosts sharing one env never install at once) and is skipped when the
    env's ``.deployctl-runtime-installed`` records a wheel with the same sha256 (byte-identical code, which a
    running runtime of another release may be using). Returns whether pip ran. Raises RemoteError."""
    h = host.config
    rdir = release_dir(h, release_id)
    q = shlex.quote
    link = current_link(h)
    script = f"""set -e
rdir={q(rdir)}
test -f "$rdir/release.json" || {{ echo "release {release_id} is not on this host ($rdir)" >&2; exit 3; }}
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
    r = host.run(["bash", "-c", script], timeout=timeout + 30)
    return "installed" in r.stdout


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
    return gone
