"""The systemd target's autoscale units (``control/``): a oneshot service that runs `deployctl autoscale --once`
and a timer that starts it again a minute after each run ends (deployctl.rollout.autoscale_run decides)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from deployctl.render.release import RenderedFile, render_template

if TYPE_CHECKING:
    from deployctl.config import DeployConfig

DEPLOYCTL = "/usr/local/bin/deployctl"  # where the unit expects deployctl (pipx install --global puts it there)
EVERY = "1min"  # the pause between two decisions (after the window each one reads)
# a scale out may install, wake, verify and warm up a host: give it the rollout's longest step
ACT_S = 1800


def autoscale_units(cfg: DeployConfig) -> list[RenderedFile]:
    """control/deployctl-<service>-autoscale.service and .timer (systemd-analyze verify checks both)."""
    unit = f"deployctl-{cfg.service.name}-autoscale.service"
    timer = unit.replace(".service", ".timer")
    ctx = {"service": cfg.service, "unit": unit, "timer": timer, "deployctl": DEPLOYCTL,
           "config": f"/etc/deployctl/{cfg.service.name}/deploy.yaml", "every": EVERY,
           "window_s": f"{cfg.autoscale.window_s:g}", "timeout_s": math.ceil(cfg.autoscale.window_s) + ACT_S}
    return [RenderedFile(f"control/{unit}", render_template("autoscale.service.j2", ctx)),
            RenderedFile(f"control/{timer}", render_template("autoscale.timer.j2", ctx))]
