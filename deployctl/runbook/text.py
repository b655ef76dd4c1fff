"""A runbook as readable text (``deployctl runbook show``)."""
from __future__ import annotations

from deployctl.runbook.model import Action, Runbook


ACTION_TEXT = {
    "restart": "restart the runtime", "start": "start the runtime", "stop": "stop the runtime",
    "free_port": "free server.port (stop the process holding it)", "rollback": "roll back to the previous release",
    "abort": "abort the rollout (all traffic back to stable)", "drain": "drain this host (no new traffic)",
    "adjust": "set in deploy.yaml, re-render runtime.yaml and restart:",
    "stop_standby": "stop the expired standby (the previous release asleep on the other port)",
    "cordon": "cordon this host (router weight 0, in-flight requests awaited, recorded)",
    "uncordon": "uncordon this host (verify: ready, sample, golden answers; then its weight back)",
}


def _flow(flow) -> str:
    if isinstance(flow, Action):
        ask = "asks first" if flow.needs_confirmation else "no confirmation"
        what = f"escalate: {flow.message}" if flow.action == "escalate" else ACTION_TEXT[flow.action]
        if flow.set:
            what += " " + ", ".join(f"{k} = {v}" for k, v in flow.set.items())
        then = {"next": "then the next step", "stop": "then stop"}.get(flow.then, f"then step {flow.then}")
        return f"{what} ({ask}); {then}"
    return {"next": "go on", "stop": "stop here"}.get(flow, f"go to step {flow}")


def _check(step) -> str:
    spec = step.check.spec.model_dump(by_alias=True, exclude_defaults=True)
    args = ", ".join(f"{k}={v!r}" for k, v in spec.items())
    return f"{step.check.kind}({args})"


def render_text(rb: Runbook) -> str:
    """Title, symptoms, description, then numbered steps with check, expectation, and what each outcome does."""
    lines = [rb.title, "=" * len(rb.title), "", "Use when:"]
    lines += [f"  - {w}" for w in rb.when]
    if rb.description:
        lines += ["", rb.description.strip()]
    lines += ["", "Steps:"]
    for n, step in enumerate(rb.steps, 1):
        lines.append(f"  {n}. {step.title}  [{step.id}]")
        if step.why:
            lines.append(f"     why: {step.why.strip()}")
        lines.append(f"     check: {_check(step)}" + (f", polling up to {step.timeout_s:g} s" if step.wait else f", timeout {step.timeout_s:g} s"))
        lines.append(f"     expect: {step.expect}")
        lines.append(f"     if as expected: {_flow(step.on_pass)}")
        lines.append(f"     if not: {_flow(step.on_fail)}")
        if step.record:
            lines.append(f"     records: {', '.join(step.record)}")
    return "\n".join(lines)
