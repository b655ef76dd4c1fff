"""``deploy --validate functional``: the functional layer against each canary host, directly (the address and port
the router uses, as the golden outputs do), before the first weight step."""
from __future__ import annotations

from typing import Callable, Optional

from deployctl.bench.fit import server_info
from deployctl.config import DeployConfig
from deployctl.rollout.probes import host_url
from deployctl.validate.client import Endpoint
from deployctl.validate.functional import run_functional


def check_hosts(cfg: DeployConfig, names: list[str], *, api_key: Optional[str] = None,
                say: Callable[[str], None] = lambda _m: None) -> Optional[str]:
    """None when every named host passes the functional layer, else the first failure as one line naming the host,
    the check and the case."""
    by = {h.name: h for h in cfg.hosts}
    for name in names:
        url = host_url(cfg, by[name])
        info = server_info(url, {"Authorization": f"Bearer {api_key}"} if api_key else {})
        res = run_functional(Endpoint(url, info.model, info.max_model_len or cfg.engine.max_model_len, api_key))
        say(f"{name}: {res.summary}")
        if res.verdict == "fail":
            return f"{name}: {res.problems[0] if res.problems else res.summary}"
    return None
