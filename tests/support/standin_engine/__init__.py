"""The light stand-in engine for fleet tests (TEST ONLY): a ``deployctl_runtime`` package that answers what deployctl
asks of a runtime, packed as a wheel deployctl deploys through its ordinary DEPLOYCTL_RUNTIME_WHEEL setting.

``standin_wheel(out_dir) -> Path``: ``deployctl_runtime-0.1.0+standin-py3-none-any.whl`` built with zipfile (no pip,
milliseconds), reused while the sources are unchanged. deployctl's code path is the production one: the same
upload, install (pip --no-deps into the host env), launch.sh supervisor, verify, router and state files; only the
process launch.sh starts is this server instead of the model engine. The version's local part (``+standin``) shows in
release ids and release.json, so a stand-in release can never pass for a real one.
"""
from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

PKG = Path(__file__).resolve().parent / "deployctl_runtime"
VERSION = "0.1.0+standin"


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def standin_wheel(out_dir: Path) -> Path:
    """Build (or reuse) the stand-in wheel under ``out_dir``/<hash of the sources>/. Returns its path."""
    files = {f"deployctl_runtime/{p.name}": p.read_bytes() for p in sorted(PKG.glob("*.py"))}
    key = hashlib.sha256(b"".join(k.encode() + v for k, v in files.items())).hexdigest()[:12]
    dist = f"deployctl_runtime-{VERSION}.dist-info"
    whl = Path(out_dir) / key / f"deployctl_runtime-{VERSION}-py3-none-any.whl"
    if whl.is_file():
        return whl
    whl.parent.mkdir(parents=True, exist_ok=True)
    files[f"{dist}/METADATA"] = (f"Metadata-Version: 2.1\nName: deployctl-runtime\nVersion: {VERSION}\n"
                                 "Summary: TEST-ONLY stand-in for the deployctl runtime\n").encode()
    files[f"{dist}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: deployctl-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = "".join(f"{name},{_digest(data)},{len(data)}\n" for name, data in files.items()) + f"{dist}/RECORD,,\n"
    files[f"{dist}/RECORD"] = record.encode()
    tmp = whl.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            zi = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            zi.external_attr = 0o644 << 16
            z.writestr(zi, data)
    tmp.rename(whl)
    return whl
