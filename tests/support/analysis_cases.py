"""The shared table of analysis windows (tests/data/analysis_cases.yaml): one case list for deployctl deploy's
judge and for the AnalysisTemplate's PromQL under promtool (a helper module, not a test file)."""
from __future__ import annotations

import yaml

from support.paths import DATA

TABLE = yaml.safe_load((DATA / "analysis_cases.yaml").read_text())
CASES = TABLE["cases"]
IDS = [c["name"] for c in CASES]


def config(engine: dict | None = None):
    """deploy.yaml (support.render's) with the table's rollout.analysis merged in; ``engine`` (default: the bundled
    runtime) is merged into its engine section."""
    from support.render import make_config

    return make_config(rollout={"analysis": TABLE["analysis"]}, slo=TABLE["slo"],
                       engine=engine or {"kind": "deployctl-runtime"})


def e2e(side: dict) -> float:
    """The side's P99 E2E in seconds (the table's e2e_default when the row has none)."""
    return side.get("e2e_p99_s", TABLE["e2e_default"])


def kv(side: dict) -> float:
    """The side's KV cache usage 0-1 (the table's kv_default when the row has none)."""
    return side.get("kv_usage", TABLE["kv_default"])
