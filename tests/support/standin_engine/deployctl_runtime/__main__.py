"""``python -m deployctl_runtime serve --config runtime.yaml``: what launch.sh runs (the stand-in's only command)."""
import sys

from deployctl_runtime.server import serve

if len(sys.argv) < 2 or sys.argv[1] != "serve":
    print("deployctl-runtime (stand-in): only `serve` is available", file=sys.stderr)
    raise SystemExit(2)
raise SystemExit(serve(sys.argv[2:]))
