"""Executable on-call runbooks: YAML files in runbooks/ whose steps check, decide, act and leave an audit trail.

Layers (each module one job):
- ``model``   the file format (pydantic), loading with ``file:line: problem`` errors.
- ``expect``  the expected-condition mini language (``"== 200"``, ``"< 0.9"``, ``"in [free, runtime]"``).
- ``context`` the variables a runbook may use (``{port}``, ``{deploy_root}``, ``{obs.STEP}``) and templating.
- ``checks``  observe one value on a host: preflight check, HTTP probe, metric query, log search, command,
              setting, port holder.
- ``actions`` what a failed step does: restart, start, stop, free_port, rollback, abort, drain, adjust, escalate.
- ``runner``  the step machine: check → expected → action (confirmation unless --yes) or branch; dry-run.
- ``audit``   one JSON line per step on the host's ``state/audit.jsonl``.
"""
