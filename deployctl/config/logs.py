"""deploy.yaml ``logs:``: the cap on each host's runtime log (``shared/logs/runtime.log``, where launch.sh and
systemd append what the engine prints to stdout and stderr, across releases).

When the file reaches ``max_bytes`` it is copied to ``runtime.log.1`` (older copies shift to ``.2`` …, at most
``backup_count`` kept) and truncated in place: logrotate's ``copytruncate``. Engines keep writing through their
O_APPEND descriptor, so nothing is restarted; a line written between the copy and the truncation is lost, as with
logrotate. The process launcher checks the size every ``launch.sh`` LOG_CHECK_S seconds (10; a chatty engine can pass
the cap by what it writes in that time). The bundled runtime's own ``--log-file`` rotation uses the same defaults
(deployctl_runtime.server.cli: 100 MiB, 5 files)."""
from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from deployctl.config.units import parse_bytes

MiB = 1024 * 1024


class LogsConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    max_bytes: Annotated[int, BeforeValidator(parse_bytes), Field(ge=4096)] = 100 * MiB
    """Size at which the runtime's log file is rotated (bytes or a size string)."""
    backup_count: int = Field(5, ge=1, le=100)
    """How many rotated log files are kept."""
