"""`serve` settings: one frozen pydantic model fed from defaults, then the YAML `--config`, then command-line flags.

YAML keys are the flag names with dashes turned into underscores (`--max-model-len` -> `max_model_len`); unknown
keys and wrong types are errors naming the key. API keys are never a setting here (env or --api-key-file only).
The engine settings' values are checked by EngineArgs.validate alone (deployctl_runtime/engine_args.py); byte sizes
follow its ``parse_bytes`` grammar (``512m`` is 512 MiB).
"""
from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from deployctl_runtime.engine_args import EngineArgs, parse_bytes
from deployctl_runtime.isolation import DEFAULT_STEP_RETRIES_PER_MIN

class _ServeSettings(BaseModel):
    """The serve settings that are not engine settings (ServeConfig adds EngineArgs' fields to these)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    served_model_name: str | None = None
    max_queued_requests: int = Field(256, ge=0)
    # Per-request caps (400 invalid_request_error above them): the prompt's tokens, and max_tokens; an omitted
    # max_tokens defaults to min(remaining context, max_completion_tokens) instead of the whole remaining context.
    max_prompt_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    request_timeout_s: float = Field(600.0, gt=0)
    drain_timeout_s: float = Field(30.0, ge=0)
    # SSE comment (": keep-alive") after this many seconds without an event while a stream waits in the queue or
    # a long prefill, so a proxy's read timeout (nginx proxy_read_timeout) never fires on a live stream; 0: off.
    sse_keepalive_s: float = Field(15.0, ge=0)
    # uvicorn's timeout_keep_alive: an idle client connection is closed after this. Longer than the router's upstream
    # keepalive_timeout (deployctl renders 75 s against nginx's 60 s: deployctl/engines/keepalive.py), so the router
    # never reuses a connection the runtime is closing.
    keep_alive_timeout_s: float = Field(75.0, gt=0)
    api_key_file: str | None = None
    metrics_public: bool = False
    release_id: str | None = None
    # which replica of the release this process is (deployctl's host-side identity check: GET /identity)
    replica_index: int = Field(0, ge=0)
    # the progress watchdog (watchdog.py): with requests open and no engine step completed for this long, the
    # runtime answers 503 engine_stalled, fails its open requests and exits 4 (lifecycle.EXIT_ENGINE_STALLED); 0: off
    engine_stall_timeout_s: float = Field(120.0, ge=0)
    skip_verify: bool = False
    log_requests: bool = False
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_file: str | None = None  # also log here, rotated by size (logging.handlers.RotatingFileHandler)
    log_max_bytes: int = Field(100 * 2**20, ge=1024)  # rotate when the file would grow past this
    log_backup_count: int = Field(5, ge=1, le=100)  # keep this many rotated files (.1 newest); older are deleted
    # fault isolation (deployctl_runtime/isolation.py): extra message substrings that mark a step's exception as
    # fatal (the device is poisoned: fail open requests, exit 3 to be restarted), besides the CUDA error markers
    fatal_error_marker: list[str] = []
    # this many requests failed alone (their step raised) within fatal_error_window_s: exit 3 as well; 0: never
    fatal_after_errors: int = Field(10, ge=0)
    fatal_error_window_s: float = Field(60.0, gt=0)
    # extra forwards failed engine steps may run to isolate their culprit, per minute, all steps together
    # (isolation.py: at most ceil(log2 n) + 1 per failed step); once spent, a failed step's unresolved requests fail
    max_step_retries_per_min: int = Field(DEFAULT_STEP_RETRIES_PER_MIN, ge=0)
    # a request field not in the field table (fields.py): 400 unsupported_parameter naming it (default), or, when
    # true, ignored with one warning per field name as vLLM does
    ignore_unknown_fields: bool = False

    @field_validator("kv_cache_memory", "log_max_bytes", mode="before", check_fields=False)
    @classmethod
    def _bytes(cls, v: Any) -> Any:
        return None if v is None else parse_bytes(v)

    def engine_args(self) -> dict[str, Any]:
        """Keyword arguments for EngineArgs (ENGINE_API.md): every EngineArgs field."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(EngineArgs)}


# The engine settings are EngineArgs' own fields (names, types, defaults): declared once, in engine_args.py.
_ENGINE_TYPES = typing.get_type_hints(EngineArgs)
ServeConfig = create_model(
    "ServeConfig", __base__=_ServeSettings, __module__=__name__,
    **{f.name: (_ENGINE_TYPES[f.name], ... if f.default is dataclasses.MISSING else f.default)
       for f in dataclasses.fields(EngineArgs)})


def load_config(cli: dict[str, Any], config_path: str | None) -> ServeConfig:
    """Merge YAML file values under explicit CLI values. Raises ValueError with a one-line message."""
    values: dict[str, Any] = {}
    if config_path:
        import yaml

        try:
            loaded = yaml.safe_load(Path(config_path).read_text(encoding="utf-8")) or {}
        except OSError as exc:
            raise ValueError(f"--config {config_path}: cannot read it ({exc.strerror})") from None
        except UnicodeDecodeError as exc:
            raise ValueError(f"--config {config_path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
                             f"{exc.start})") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{config_path}:{mark.line + 1}:{mark.column + 1}" if mark else config_path
            raise ValueError(f"--config {where}: not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
        if not isinstance(loaded, dict):
            raise ValueError(f"--config {config_path}: must be a mapping of serve settings")
        for key in loaded:
            if key in ("api_key", "api_keys"):
                raise ValueError(f"--config {config_path}: '{key}' is not allowed here; "
                                 "use env DEPLOYCTL_RUNTIME_API_KEY or api_key_file")
        values.update(loaded)
    values.update({k: v for k, v in cli.items() if v is not None})
    if "model" not in values:
        raise ValueError("--model is required (or `model:` in --config)")
    def where(key: str) -> str:
        return f" in {config_path}" if config_path and key in values and key not in cli else ""

    try:
        cfg = ServeConfig(**values)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        key = ".".join(str(p) for p in err["loc"])
        raise ValueError(f"serve setting '{key}'{where(key)}: {err['msg']} (got {err.get('input')!r})") from None
    try:
        EngineArgs(**cfg.engine_args()).validate()
    except ValueError as exc:
        key, _, problem = str(exc).partition(": ")
        raise ValueError(f"serve setting '{key}'{where(key)}: {problem}") from None
    return cfg
