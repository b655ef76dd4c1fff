"""The disk rule: does what a deploy puts on a host fit there. One home, used by preflight's ``disk`` check (over
the probe's facts), by deploy before any upload (deployctl.rollout.diskcheck, with the payload measured) and by
``status`` (each host's free space, flagged when the next deploy would not fit).

Needed on the filesystem of a host's deploy_root (bytes):

- **release payload × 2**: the tar file deployctl uploads (the runtime wheel plus the rendered files, measured on
  the operator's machine before the upload) and its unpacked copy: both are on disk until the tar file is removed
  (deployctl.rollout.release.upload). Without a measured payload (``preflight``, ``status``) the current release
  directory's size stands in for it (the next release ships the same kind of files).
- **engine venv**: when engine.version pins a foreign engine that the host has neither in hosts[].python's env nor
  as the machine's shared venv (release.py ENGINE_INSTALL installs it under <deploy_root>/shared/engines):
  ENGINE_VENV_BYTES of that engine, an estimate (below), not a measurement.
- **model**: without model.source (deployctl.weights checks its own fetches), the bytes of the model still
  missing under model.path (model.safetensors.index.json's metadata.total_size, Hugging Face's sharded checkpoint
  index, less the .safetensors bytes present), when model.path is on the same filesystem; on another filesystem
  they are checked there on their own, with the margin.
- **margin**: MARGIN_SHARE of the parts above plus MARGIN_FLOOR_BYTES.

Free: statvfs f_bavail × f_frsize (what an unprivileged user may write) of deploy_root or its nearest existing
parent, plus the bytes the leftovers of interrupted uploads hold there (hostscripts.probe.is_upload_leftover): the
next upload removes them first, so their space counts as free.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from deployctl.config import DeployConfig, HostConfig
from deployctl.config.units import format_bytes

GiB = 2**30
MiB = 2**20

# Margin: 10% of what is shipped covers the estimate's error (a venv's installed size varies with pip's choice of
# wheels; tar headers and block rounding add to a payload) and 64 MiB what a deploy writes besides the release
# (state, history, journal and lock files, the first lines of the engine's log; the log itself is capped by
# deploy.yaml ``logs:``), so that no deploy leaves a filesystem at its last byte.
MARGIN_SHARE = 0.10
MARGIN_FLOOR_BYTES = 64 * MiB

# The installed size of an engine's own venv (pip install <dist>==<version> into a fresh venv with its
# dependencies), by engine.kind: estimates, NOT measured here (no GPU host). The CUDA build of torch and the
# nvidia-*-cu12 wheels it pulls dominate (pip's install logs show them at 3+ GB downloaded, e.g. cuSPARSE 196 MB,
# cuSOLVER 124 MB, cuFFT 122 MB in vllm-project/vllm issue #4011; unpacked .so files take about twice that); vLLM
# and SGLang add their kernels (xformers, flashinfer, triton). Rounded up; a kind not listed is taken as the largest.
ENGINE_VENV_BYTES = {"vllm": 10 * GiB, "sglang": 10 * GiB, "transformers": 7 * GiB}
ENGINE_VENV_SOURCE = "estimated, deployctl.preflight.disk.ENGINE_VENV_BYTES"


@dataclass(frozen=True)
class Need:
    """Bytes a deploy needs on one filesystem: ``parts`` [(what, bytes)] (the margin is the last part)."""

    parts: tuple

    @property
    def total(self) -> int:
        return sum(b for _, b in self.parts)

    def text(self) -> str:
        """'64.1 MiB (release payload 2 × 60.0 KiB (tar file + unpacked), margin 64.0 MiB)': the total, each part."""
        return f"{format_bytes(self.total)} ({', '.join(w for w, _ in self.parts)})"


@dataclass(frozen=True)
class Verdict:
    """One filesystem of one host: ``role`` "deploy_root" or "model", ``path`` (the configured one),
    ``checked_path`` (where free space was read), bytes free and held by leftovers (counted as free)."""

    host: str
    role: str
    path: str
    checked_path: str
    need: Need
    free_bytes: int
    leftover_bytes: int = 0
    leftovers: tuple = ()

    @property
    def available(self) -> int:
        return self.free_bytes + self.leftover_bytes

    @property
    def ok(self) -> bool:
        return self.available >= self.need.total

    def free_text(self) -> str:
        more = (f" + {format_bytes(self.leftover_bytes)} held by {len(self.leftovers)} leftover(s) of interrupted "
                f"uploads, which the deploy removes first" if self.leftover_bytes else "")
        return f"{format_bytes(self.free_bytes)} free{more}"

    def line(self) -> str:
        """'b: deploy_root /srv/x needs 70.3 MiB (release payload ..., margin ...); 58.0 MiB free'."""
        where = self.path if self.checked_path == self.path else f"{self.path} (checked at {self.checked_path})"
        return f"{self.host}: {self.role} {where} needs {self.need.text()}; {self.free_text()}"

    def fix(self) -> str:
        short = format_bytes(self.need.total - self.available)
        if self.role == "model":
            return (f"free {short} on the filesystem of {self.checked_path} (or a bigger disk) before the model is "
                    f"copied there")
        return (f"free {short} on the filesystem of {self.checked_path}: old model versions (`deployctl models "
                f"prune`), fewer kept releases (rollout.keep_releases), other files there; or give the host a "
                f"bigger disk or another hosts[].deploy_root")

    def to_json(self) -> dict:
        return {"role": self.role, "path": self.path, "checked_path": self.checked_path,
                "free_bytes": self.free_bytes, "leftover_bytes": self.leftover_bytes,
                "leftovers": list(self.leftovers), "need_bytes": self.need.total,
                "need": [{"what": w, "bytes": b} for w, b in self.need.parts], "fits": self.ok}


def margin(nbytes: int) -> int:
    """MARGIN_SHARE of ``nbytes`` + MARGIN_FLOOR_BYTES."""
    return int(nbytes * MARGIN_SHARE) + MARGIN_FLOOR_BYTES


def venv_state(cfg: DeployConfig, facts: dict) -> Optional[str]:
    """"host env" | "shared" | "missing" for a pinned foreign engine, None otherwise: the probe's ``space``
    section's ``engine_venv``, else derived from its ``engine`` section (recorded facts before ``space``)."""
    if cfg.engine.kind == "deployctl-runtime" or not cfg.engine.version:
        return None
    space = facts.get("space") or {}
    if "engine_venv" in space:
        return space["engine_venv"]
    e = facts.get("engine") or {}
    if e.get("version") == cfg.engine.version:
        return "host env"
    shared = e.get("shared") or {}
    return "shared" if shared.get("version") == cfg.engine.version else "missing"


def model_missing(cfg: DeployConfig, space: dict) -> Optional[int]:
    """Bytes of the model not yet under model.path (module doc); None when model.source fetches it or its size is
    unknown (no safetensors index)."""
    if cfg.model.source:
        return None
    m = space.get("model") or {}
    if m.get("declared_bytes") is None:
        return None
    return max(0, int(m["declared_bytes"]) - int(m.get("bytes") or 0))


def verdicts(cfg: DeployConfig, host: HostConfig, facts: dict, payload_bytes: Optional[int] = None) -> list[Verdict]:
    """The deploy_root verdict of ``host`` (and the model path's, when on another filesystem with bytes missing)
    from the probe's facts (``space``, or for recorded facts ``disk`` alone). ``payload_bytes``: the measured
    release payload; None: the current release's size stands in (module doc). [] without disk facts."""
    space = facts.get("space") or {"disk": facts.get("disk") or []}
    disks = {d["role"]: d for d in space.get("disk") or []}
    root = disks.get("deploy_root")
    if root is None:
        return []
    if payload_bytes is not None:
        payload, said = payload_bytes, f"release payload 2 × {format_bytes(payload_bytes)} (tar file + unpacked)"
    elif space.get("release_bytes") is not None:
        payload = int(space["release_bytes"])
        said = f"release payload ~2 × {format_bytes(payload)} (the current release's size)"
    else:
        payload, said = 0, "release payload not measured here"
    parts = [(said, 2 * payload)]
    venv = venv_state(cfg, facts)
    if venv == "missing":
        size = ENGINE_VENV_BYTES.get(cfg.engine.kind, max(ENGINE_VENV_BYTES.values()))
        parts.append((f"{cfg.engine.kind}=={cfg.engine.version} venv {format_bytes(size)} ({ENGINE_VENV_SOURCE})",
                      size))
    missing = model_missing(cfg, space)
    model = disks.get("model")
    same_fs = model is not None and model.get("device") is not None and model.get("device") == root.get("device")
    if missing and same_fs:
        parts.append((f"model {format_bytes(missing)} still to copy into {cfg.model.path}", missing))
    shipped = sum(b for _, b in parts)
    parts.append((f"margin {format_bytes(margin(shipped))}", margin(shipped)))
    left = space.get("leftovers") or []
    out = [Verdict(host.name, "deploy_root", root["path"], root["checked_path"], Need(tuple(parts)),
                   int(root["free_bytes"]), sum(int(x["bytes"]) for x in left), tuple(x["name"] for x in left))]
    if missing and model is not None and not same_fs:
        need = Need(((f"model {format_bytes(missing)} still to copy", missing),
                     (f"margin {format_bytes(margin(missing))}", margin(missing))))
        out.append(Verdict(host.name, "model", model["path"], model["checked_path"], need, int(model["free_bytes"])))
    return out
