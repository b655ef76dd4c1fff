"""The rollout: releases on hosts, the deploy lock, shared state, launcher, verification, the router,
canary analysis, the deploy step machine and rollback. Lower layers of the CLI: nothing here prints;
progress reaches the CLI through ``Progress`` callbacks (deployctl.rollout.events)."""
