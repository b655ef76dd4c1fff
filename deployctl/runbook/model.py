"""The runbook file format (YAML in runbooks/, one runbook per file, its name is the file's stem).

```yaml
title: Service won't start
when: [the runtime exits right after start, /healthz never answers]     # symptoms
steps:
  - id: serving                        # [a-z][a-z0-9_]*, unique
    title: Is the runtime serving already?
    check: {http: {path: /readyz}}     # exactly one kind: http, metric, log, command, preflight, setting,
                                       #   port, process, capacity (see checks.py)
    expect: "== 200"                   # expect.py
    on_pass: stop                      # next (default) | stop | a step id
    on_fail: next                      # next (default) | stop | a step id | an action:
  - id: port
    check: {port: {}}
    expect: "in [free, runtime]"
    on_fail: {action: free_port, confirm: true, then: next, timeout_s: 30}
    timeout_s: 10                      # the check's timeout (and polling window with wait: true)
    wait: false                        # poll the check until it holds or timeout_s passes
    record: [pid, process]             # observed fields written to the audit record besides the value
```
``load_runbook`` raises ConfigError (exit 3) as ``FILE:LINE: problem``.
"""
from __future__ import annotations

import string
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from deployctl.config.yamlsource import parse_yaml
from deployctl.errors import ConfigError
from deployctl.runbook.expect import Expect

STEP_ID = r"^[a-z][a-z0-9_]*$"
FLOW_WORDS = ("next", "stop")
CHANGING_ACTIONS = ("restart", "start", "stop", "free_port", "rollback", "abort", "drain", "adjust", "stop_standby",
                    "cordon", "uncordon")
ACTIONS = CHANGING_ACTIONS + ("escalate",)
_TYPE_TAGS = ("str", "int", "float", "bool", "literal")


MAX_WAIT_S = 24 * 3600  # longest timeout_s / window_s: a runbook step must end


class _M(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class HttpCheck(_M):
    """A request to the runtime on the host (sent from the host, so loopback binds work)."""
    path: str = Field(pattern=r"^/")
    method: Literal["GET", "POST"] = "GET"
    json_body: Optional[dict[str, Any]] = Field(None, alias="json")
    field: Literal["status", "elapsed_s", "body"] = "status"


class MetricCheck(_M):
    """One value from the runtime's /metrics. name: a metric role of deployctl.engines.base.METRIC_ROLES (ttft, tpot,
    e2e, queue_time, kv_usage, waiting, running, preemptions, success, rejected) resolved through the deployed
    engine's adapter, or a literal Prometheus name. stat: value (sum over matching series), present (bool),
    quantile (histogram, q), mean (histogram sum/count), tail_ratio (histogram quantile q / mean: how far the
    tail is from the average), count (histogram count), increase (counter, over window_s).

    A histogram statistic judges only from enough observations (``samples_needed``): quantile and tail_ratio need
    promhist.min_samples_for_quantile(q) (P99: 100), mean one; ``min_samples`` may ask for more, never fewer.
    With fewer the step says "cannot judge: N samples" (polling for more within timeout_s with ``wait: true``);
    with none at all (no requests yet, or the engine exports no such metric) ``no_data`` decides."""
    name: str = Field(pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
    labels: dict[str, str] = Field(default_factory=dict)
    stat: Literal["value", "present", "quantile", "mean", "tail_ratio", "count", "increase"] = "value"
    q: Optional[float] = Field(None, gt=0, le=1)
    window_s: float = Field(0, ge=0, le=MAX_WAIT_S)
    no_data: Literal["pass", "fail"] = "pass"  # a histogram without observations (no requests yet) is nothing to judge
    min_samples: Optional[int] = Field(None, ge=1)

    @property
    def samples_needed(self) -> int:
        """Observations this statistic needs before it judges (0: it is not a statistic over observations)."""
        from deployctl.promhist import min_samples_for_quantile

        if self.stat in ("quantile", "tail_ratio"):
            needed = 1 if self.q == 1 else min_samples_for_quantile(self.q)
        elif self.stat == "mean":
            needed = 1
        else:
            return 0
        return max(needed, self.min_samples or 0)

    @model_validator(mode="after")
    def _q(self) -> "MetricCheck":
        if self.stat in ("quantile", "tail_ratio") and self.q is None:
            raise ValueError(f"stat {self.stat} needs q, e.g. q: 0.99")
        if self.min_samples is not None:
            if self.stat not in ("quantile", "tail_ratio", "mean"):
                raise ValueError(f"min_samples applies to quantile, tail_ratio and mean, not stat {self.stat}")
            floor = self.model_copy(update={"min_samples": None}).samples_needed
            if self.min_samples < floor:
                raise ValueError(f"min_samples {self.min_samples} is below what {_label(self)} needs ({floor}: with "
                                 f"fewer its value is the largest observation); leave it out or set it >= {floor}")
        if self.stat == "increase" and not self.window_s:
            raise ValueError("stat increase needs window_s, e.g. window_s: 5")
        return self


def _label(spec: "MetricCheck") -> str:
    return f"P{spec.q * 100:g}" if spec.stat in ("quantile", "tail_ratio") else spec.stat


class LogCheck(_M):
    """Lines matching ``pattern`` (extended regex) among the last ``last_lines`` of ``file``."""
    file: str = "{log_file}"
    pattern: str
    last_lines: int = Field(500, gt=0)


class CommandCheck(_M):
    """A shell command on the host; ``{variables}`` are shell-quoted when filled in."""
    run: str
    field: Literal["exit_code", "stdout"] = "exit_code"


class PreflightCheck(_M):
    """One preflight check by name; the value is its status: pass, warn or fail."""
    name: str

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        from deployctl.preflight.checks import PREFLIGHT_CHECKS

        if v not in PREFLIGHT_CHECKS:
            raise ValueError(f"no preflight check named {v!r}; known: {', '.join(PREFLIGHT_CHECKS)}")
        return v


class SettingCheck(_M):
    """A key of the runtime.yaml the host's current release runs with."""
    key: str


class CapacityCheck(_M):
    """A field of the capacity plan for deploy.yaml on this host's model (deployctl/capacity/formula.py)."""
    field: Literal["fits", "fits_one", "max_feasible_num_seqs", "max_feasible_model_len", "max_concurrency",
                   "kv_pool_tokens", "num_blocks"]


class Empty(_M):
    pass


class Check(_M):
    http: Optional[HttpCheck] = None
    metric: Optional[MetricCheck] = None
    log: Optional[LogCheck] = None
    command: Optional[CommandCheck] = None
    preflight: Optional[PreflightCheck] = None
    setting: Optional[SettingCheck] = None
    capacity: Optional[CapacityCheck] = None
    port: Optional[Empty] = None     # value: free | runtime | other (the holder of server.port)
    process: Optional[Empty] = None  # value: true when the pidfile's runtime process is alive

    @model_validator(mode="after")
    def _one(self) -> "Check":
        kinds = [k for k in type(self).model_fields if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(f"a check has exactly one kind of {', '.join(type(self).model_fields)}; got {kinds or 'none'}")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in type(self).model_fields if getattr(self, k) is not None)

    @property
    def spec(self) -> BaseModel:
        return getattr(self, self.kind)


class Action(_M):
    """What a failed step does. ``confirm`` defaults to true for changing actions (false for escalate);
    after a changing action the step's check runs again (polling up to ``timeout_s``) to tell fixed from not,
    unless ``verify`` is false (the outcome is then "done")."""
    action: Literal[ACTIONS]  # type: ignore[valid-type]
    message: Optional[str] = None
    set: dict[str, Union[str, int, float, bool]] = Field(default_factory=dict)
    confirm: Optional[bool] = None
    then: str = "stop"
    timeout_s: float = Field(60, gt=0, le=MAX_WAIT_S)
    verify: bool = True  # false: the step's check says nothing about this action (abort moves traffic only)

    @model_validator(mode="after")
    def _fields(self) -> "Action":
        if self.action == "escalate" and not self.message:
            raise ValueError("action escalate needs a message for the person it escalates to")
        if self.action == "adjust" and not self.set:
            raise ValueError("action adjust needs set: {engine.KEY: VALUE}")
        if self.set and self.action != "adjust":
            raise ValueError(f"set is only for action adjust, not {self.action}")
        return self

    @property
    def is_changing(self) -> bool:
        return self.action in CHANGING_ACTIONS

    @property
    def needs_confirmation(self) -> bool:
        return self.is_changing if self.confirm is None else self.confirm


class Step(_M):
    id: str = Field(pattern=STEP_ID)
    title: str
    why: Optional[str] = None
    check: Check
    expect: str
    timeout_s: float = Field(30, gt=0, le=MAX_WAIT_S)
    wait: bool = False
    record: list[str] = Field(default_factory=list)
    on_pass: str = "next"
    on_fail: Union[str, Action] = "next"

    @field_validator("expect", mode="before")
    @classmethod
    def _expect(cls, v: Any) -> str:
        Expect.parse(str(v))
        return str(v)

    @property
    def expectation(self) -> Expect:
        return Expect.parse(self.expect)


class Runbook(_M):
    title: str
    when: list[str] = Field(min_length=1)
    description: Optional[str] = None
    steps: list[Step] = Field(min_length=1)
    name: str = ""  # the file's stem, set by the loader
    path: str = ""

    def step_index(self, step_id: str) -> int:
        return next(i for i, s in enumerate(self.steps) if s.id == step_id)


def _where(source: str, lines: dict[tuple, int], loc: tuple) -> str:
    for cut in range(len(loc), -1, -1):
        if loc[:cut] in lines:
            return f"{source}:{lines[loc[:cut]]}"
    return source


def _templates(step: Step) -> list[tuple[tuple, str]]:
    """(location, text) of every string in the step that may hold {variables}."""
    out: list[tuple[tuple, str]] = [(("expect",), step.expect)]
    spec = step.check.spec
    def strings(loc: tuple, value: Any) -> None:
        if isinstance(value, str):
            out.append((loc, value))
        elif isinstance(value, dict):
            for k, v in value.items():
                strings(loc + (k,), v)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                strings(loc + (i,), v)

    strings(("check", step.check.kind), spec.model_dump(by_alias=True))
    if isinstance(step.on_fail, Action):
        if step.on_fail.message:
            out.append((("on_fail", "message"), step.on_fail.message))
        out += [(("on_fail", "set", k), v) for k, v in step.on_fail.set.items() if isinstance(v, str)]
    return out


def _cross_check(rb: Runbook, source: str, lines: dict[tuple, int]) -> None:
    from deployctl.runbook.context import VARIABLES

    ids = [s.id for s in rb.steps]
    for i, step in enumerate(rb.steps):
        at = lambda *loc: _where(source, lines, ("steps", i) + loc)  # noqa: E731
        if step.id in ids[:i]:
            raise ConfigError(f"{at('id')}: step id {step.id!r} is used twice; give every step its own id")
        flows = [("on_pass", step.on_pass)]
        flows.append(("on_fail", step.on_fail) if isinstance(step.on_fail, str) else (("on_fail", "then"), step.on_fail.then))
        for loc, target in flows:
            loc = loc if isinstance(loc, tuple) else (loc,)
            if target not in FLOW_WORDS and target not in ids:
                raise ConfigError(f"{at(*loc)}: {'.'.join(loc)} {target!r} is not next, stop or a step id ({', '.join(ids)})")
            if target in ids[: i + 1]:
                # Forward-only branches keep the step graph acyclic: a loop could repeat an action without end.
                raise ConfigError(f"{at(*loc)}: {'.'.join(loc)} {target!r} branches back to step {target!r}, which "
                                  f"makes a loop", fix="branch only to later steps; use wait: true to poll a check")
        for loc, text in _templates(step):
            try:
                fields = [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
            except ValueError as exc:
                raise ConfigError(f"{at(*loc)}: bad {{placeholder}} in {text!r}: {exc}; write {{{{ for a literal brace") from None
            for f in fields:
                head, _, rest = f.partition(".")
                if head == "obs":
                    ref = rest.split(".")[0]
                    if ref not in ids:
                        raise ConfigError(f"{at(*loc)}: {{{f}}} names no step; use {{obs.STEP_ID}} with one of {', '.join(ids)}")
                elif head not in VARIABLES:
                    raise ConfigError(f"{at(*loc)}: unknown variable {{{f}}}; known: {', '.join(sorted(VARIABLES))}, obs.STEP_ID")


def parse_runbook(text: str, source: str, name: str) -> Runbook:
    """Parse and validate one runbook. Raises ConfigError ``SOURCE:LINE: problem`` (exit 3)."""
    data, lines = parse_yaml(text, source)
    if not isinstance(data, dict):
        raise ConfigError(f"{source}:1: a runbook is a mapping with title, when and steps; got {type(data).__name__}")
    lines = {(): 1, **lines}
    try:
        rb = Runbook.model_validate({**data, "name": name, "path": source})
    except ValidationError as exc:
        # a union (on_fail: str | Action) reports one error per member: the deepest one is the useful one
        # (a type mismatch with the other member, e.g. "not a string" for a mapping, is the least useful)
        err = max(exc.errors(), key=lambda e: (len(e["loc"]), not e["type"].endswith("_type")))
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and (p in _TYPE_TAGS or p[:1].isupper() or "[" in p)))
        dotted = ".".join(str(p) for p in loc) or "(top level)"
        if err["type"] == "extra_forbidden":
            problem = f"unknown key {dotted!r}"
        elif err["type"] == "missing":
            problem = f"{dotted} is required"
        else:
            got = err.get("input")
            shown = "" if isinstance(got, (dict, list)) or got is None else f" (got {got!r})"
            problem = f"{dotted}: {err['msg'].removeprefix('Value error, ')}{shown}"
        raise ConfigError(f"{_where(source, lines, loc)}: {problem}") from None
    _cross_check(rb, source, lines)
    return rb


def load_runbook(path: Path) -> Runbook:
    """Read and validate ``path``. Raises ConfigError (exit 3)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})",
                          fix="save the runbook as UTF-8") from None
    return parse_runbook(text, str(path), path.stem)
