"""One runtime on one host, as rollout and runbooks both drive it.

- ``launcher`` start, stop and restart (launch.sh for ``launcher: process``, systemctl for ``launcher: systemd``),
  liveness, the runtime log.
- ``http``     one HTTP request to the runtime, made on its host (loopback binds included).
- ``verify``   the readiness wait (/readyz) and the sample inference.
"""
