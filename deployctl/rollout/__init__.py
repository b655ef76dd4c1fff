"""The rollout: releases on hosts, the deploy lock, shared state, the router, canary analysis, the deploy step
machine and rollback (starting, stopping and verifying the runtime on one host: deployctl.service). Lower layers
of the CLI: nothing here prints; progress reaches the CLI through ``Progress`` callbacks (deployctl.rollout.events)."""
