"""One GPU host of deploy.yaml's ``hosts:`` list: how deployctl reaches it (SSH), where the release lives on it
(deploy_root), which GPUs and ports its engine uses, and whether it serves or waits in the warm pool."""
from __future__ import annotations

import re
from typing import Annotated, Literal, Optional

from pydantic import BeforeValidator, Field, PrivateAttr, field_validator, model_validator

from deployctl.config.fields import MAX_SECONDS, _Frozen
from deployctl.config.router import USER_PATTERN
from deployctl.config.units import parse_duration

# The shortest SSH keepalive interval (hosts[].keepalive_interval_s) besides 0 (off): OpenSSH's ServerAliveInterval
# counts whole seconds, and more often than that only floods the connection.
MIN_KEEPALIVE_S = 1.0


def jump_endpoint(spec: str) -> tuple[Optional[str], str, int]:
    """``hosts[].jump`` "[user@]host[:port]" (ssh -J's form; an IPv6 address in brackets) as (user or None, host,
    port, default 22). Raises ValueError naming the expected form."""
    m = re.fullmatch(r"(?:([A-Za-z0-9._][A-Za-z0-9._-]*)@)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::([0-9]{1,5}))?",
                     spec)
    if m is None or not 1 <= int(m.group(3) or 22) <= 65535:
        raise ValueError(f"jump {spec!r} is not [user@]host[:port] (ssh -J's form), e.g. ops@bastion.example:2222")
    return m.group(1), m.group(2).strip("[]"), int(m.group(3) or 22)


class HostConfig(_Frozen):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """The host's name in deployctl's output and commands (--host NAME)."""
    address: str
    """The host's address for SSH; \"local\" runs on this machine without SSH."""
    user: Optional[str] = Field(None, pattern=USER_PATTERN)
    """SSH user; default: the current user or ~/.ssh/config's."""
    port: int = Field(22, ge=1, le=65535)
    """SSH port."""
    deploy_root: str
    """Directory on the host under which releases, state and the shared venvs live."""
    python: str = "python3"
    """The host's Python interpreter that creates the runtime's venv."""
    launcher: Literal["systemd", "process"] = "systemd"
    """How the runtime is supervised: a systemd unit, or a process started by launch.sh."""
    gpu: int = Field(0, ge=0)
    """The first GPU index the engine uses on this host."""
    gpus: Optional[list[Annotated[int, Field(ge=0)]]] = None
    """GPU ids for tensor parallelism; default [gpu]"""
    ssh_key: Optional[str] = None
    """private key file; default: ssh agent / ~/.ssh"""
    sudo_password_env: Optional[str] = None
    """env var holding the sudo password; default: sudo -n"""
    connect_timeout_s: float = Field(10, gt=0, le=MAX_SECONDS)
    """Seconds to wait for an SSH connection to open."""
    max_channels: int = Field(8, ge=2, le=1000)
    """SSH channels deployctl opens at once on its connection to this host (one is SFTP's, the rest commands; more
    wait for a free one): keep it at or below sshd's MaxSessions there (OpenSSH's default 10)
    """
    connect_rate: float = Field(10, gt=0, le=1000, description=(
        "New SSH connections per second deployctl starts to this host's sshd, in bursts of up to the same number "
        "(deployctl.hosts.startrate). Entries that name the same address and port (one sshd: a bastion, a NAT "
        "address) share the bound, the lowest rate of them winning. Default 10: OpenSSH's MaxStartups start "
        "(10:30:100), the unauthenticated connections sshd takes before it starts dropping them."))
    jump: Optional[str] = Field(None, description=(
        "A bastion to reach this host through, as ssh's ProxyJump (-J) spells it: [user@]host[:port] (default user "
        "the host's, port 22). deployctl logs in to the bastion with this host's ssh_key and known_hosts, then opens "
        "a direct-tcpip channel from there to address:port. Unset: a direct connection."))
    keepalive_interval_s: Annotated[float, BeforeValidator(parse_duration)] = 15
    """SSH transport keepalive (deployctl.hosts.sshalive): a keepalive every keepalive_interval_s (0: off); a peer
    that answers none for keepalive_interval_s × keepalive_count is dropped as frozen (OpenSSH's
    ServerAliveInterval / ServerAliveCountMax)
    """
    keepalive_count: int = Field(3, ge=2, le=100)
    """Keepalives without an answer before SSH gives the connection up."""
    server_port: Optional[int] = Field(None, ge=1, le=65535)
    """the runtime's port on this host; default server.port"""
    spare_port: Optional[int] = Field(None, ge=1, le=65535)
    """a second port for the runtime (process launcher, bundled runtime): a rollback starts the restored release
    there beside the one serving, switches the router over, then drains the old one; the two ports alternate
    """
    dist_port: Optional[int] = Field(None, ge=1, le=65535)
    """the distributed-init (rendezvous) port of a multi-GPU engine (tensor_parallel_size > 1: SGLang --nccl-port,
    vLLM VLLM_PORT); default server_port + 20000 (engines.command.dist_port)
    """
    pool: Optional[Literal["serving", "warm"]] = Field(
        None, description="serving (the default, also when unset): the host takes traffic. warm: a provisioned host that does not serve yet; its engine is started once and kept "
                          "asleep (the standby machinery), and `deployctl scale out NAME` wakes it, checks the "
                          "release's golden answers and ramps its router weight (seconds instead of a cold start). "
                          "deploy and rollback leave it out until then.")
    # the port the runtime listens on now when that is not the configured one (after a rollback onto
    # spare_port): state read from the host (deployctl.service.launcher.load_port), never from deploy.yaml
    _active_port: Optional[int] = PrivateAttr(None)
    replicas: int = Field(1, ge=1, le=64)
    """several engines side by side on this machine (config/replicas.py: expanded into one entry per replica before
    validation); ``replica``: this entry's index among them (its unit is <service>-r<replica>.service)
    """
    replica: Optional[int] = Field(None, ge=0, le=63)
    """This entry's index among the replicas of one machine (set by the expansion of `replicas`)."""
    idle_gpus: Optional[list[Annotated[int, Field(ge=0)]]] = None
    """set by config/replicas.py on replica 0: GPU ids the entry listed beyond replicas × tensor_parallel_size (no
    replica gets them; preflight's gpus check warns)
    """

    @field_validator("deploy_root")
    @classmethod
    def _absolute_root(cls, v: str) -> str:
        # Releases, the current link and state/ are joined onto it on the host: a relative root lands in the
        # working directory (or the SSH home), "/" puts releases/ at the top of the filesystem.
        parts = v.split("/")
        if not v.startswith("/") or v.rstrip("/") == "" or any(p in (".", "..") for p in parts):
            raise ValueError("deploy_root must be an absolute directory below / without . or .. parts, "
                             "e.g. /opt/deployctl/SERVICE")
        return v

    @field_validator("keepalive_interval_s")
    @classmethod
    def _keepalive(cls, v: float) -> float:
        if v != 0 and not MIN_KEEPALIVE_S <= v <= 3600:
            raise ValueError(f"keepalive_interval_s must be 0 (off) or from {MIN_KEEPALIVE_S:g} s to 1h (a keepalive "
                             "more often than once a second floods the SSH connection); e.g. 15 or 15s")
        return v

    @field_validator("jump")
    @classmethod
    def _jump(cls, v: Optional[str]) -> Optional[str]:
        if v is not None:
            jump_endpoint(v)
        return v

    @model_validator(mode="after")
    def _spare_differs(self) -> "HostConfig":
        if self.spare_port is not None and self.spare_port == self.server_port:
            raise ValueError(f"spare_port {self.spare_port} is the host's server_port: give it another port")
        return self

    @property
    def is_local(self) -> bool:
        return self.address == "local"

    @property
    def unit(self) -> str:
        """The systemd unit name's suffix for this entry: "" or ``-r<replica>`` (config/replicas.py)."""
        return "" if self.replica is None else f"-r{self.replica}"

    @property
    def gpu_ids(self) -> list[int]:
        """The GPU ids (NVML / PCI bus order) the engine uses on this host: ``gpus``, else ``[gpu]``."""
        return list(self.gpus) if self.gpus else [self.gpu]
