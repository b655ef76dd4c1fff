"""What verifying an engine gives (``Verified``) and the pieces its checks share; the checks themselves are the
engine handle's (``Engine.wait_ready``, ``Engine.sample``, ``Engine.verify`` in deployctl.service.engine):
readiness (/readyz 200, on the device deploy.yaml asked for) and a sample inference through /v1/chat/completions
that returns at least one token, each within a timeout. A model without a
chat template (the runtime answers 400 ``no_chat_template``, C29) is verified through /v1/completions instead, and
``Verified.endpoint`` says so. Failures raise HealthError (exit 5) naming the host, what failed, and the last lines
of the runtime log."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from deployctl.config.layout import log_file
from deployctl.errors import HealthError
from deployctl.service import launcher

RELEASE_HEADER = "X-Deployctl-Release"
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


@dataclass(frozen=True)
class Verified:
    host: str
    ready_s: float  # seconds until /readyz answered 200
    tokens: int  # completion tokens of the sample inference
    release: Optional[str]  # X-Deployctl-Release of the answer
    timings: dict = field(default_factory=dict)  # seconds per phase when activated by hostops
    endpoint: str = CHAT  # the path the sample inference used

    def note(self) -> str:
        """'' for chat; a short phrase when the sample went through /v1/completions."""
        return "" if self.endpoint == CHAT else f" via {self.endpoint} (the model has no chat template)"


def fail(host, what: str, fix: str = "") -> HealthError:
    """A HealthError naming the host and what failed, with the runtime log's last lines and where the log is."""
    tail = launcher.log_tail(host, 8)
    more = f"; last log lines: {tail[-600:]}" if tail else ""
    where = f"see {log_file(host.config)} on {host.name}"
    return HealthError(f"{host.name}: {what}{more}", fix=f"{where}; {fix.removeprefix('see the log; ')}" if fix else where)


def no_chat_template(r) -> bool:
    """The runtime's 400 for a model without a chat template (error code ``no_chat_template``)."""
    if r.status != 400:
        return False
    try:
        return (r.json().get("error") or {}).get("code") == "no_chat_template"
    except (ValueError, AttributeError):
        return False
