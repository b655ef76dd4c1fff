"""The frozen base of every deploy.yaml model and the field types the sections share.

Sizes accept integers (bytes) or strings with units ("80GiB", "40GB", "512MiB"); durations a number of seconds or a
string ("30s", "5m", "24h").
"""
from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from deployctl.config.units import parse_bytes, parse_duration

ByteSize = Annotated[int, BeforeValidator(parse_bytes), Field(gt=0)]
# Longest duration any *_s setting may take (a week): it is rendered as whole seconds into systemd units, nginx
# timeouts and k8s manifests, which reject infinity and absurd values.
MAX_SECONDS = 7 * 24 * 3600
# Seconds: a number or a duration string ("30s", "5m", "24h"; deployctl.config.units.parse_duration), up to a week.
Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0, le=MAX_SECONDS)]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)
