"""The start phases read from a runtime log (as launch.sh and the runtime write it): boot, load, warm-up."""
from deployctl.service.startlog import phases

LOG = """\
2026-12-01T09:45:39Z launch.sh[17999]: starting runtime: /venv/bin/python -m deployctl_runtime serve --config r.yaml
2026-12-01 09:45:40,764 WARNING deployctl_runtime.server: no API key configured: every route is open (loopback only)
2026-12-01 09:45:42,615 INFO uvicorn.error: Uvicorn running on http://127.0.0.1:56579 (Press CTRL+C to quit)
2026-12-01 09:45:42,621 INFO deployctl_runtime.server: verified 5 model file(s) against manifest.sha256 in 0.00 s
2026-12-01 09:45:52,347 INFO deployctl_runtime.server: KV cache: 1024 blocks x 16 tokens = 16384 tokens
2026-12-01 09:45:52,360 INFO deployctl_runtime.server: warm-up forward pass done
2026-12-01 09:45:52,424 INFO deployctl_runtime.server: ready: serving model 'tiny-chat' (max_model_len 256) in 11.3 s
2026-12-01T09:46:39Z launch.sh[18999]: starting runtime: a second start is not counted
2026-12-01 09:46:42,615 INFO uvicorn.error: Uvicorn running on http://127.0.0.1:56579 (Press CTRL+C to quit)
"""


def test_phases_of_the_first_start():
    assert phases(LOG) == {"boot_s": 3.62, "load_s": 9.73, "warmup_s": 0.08}


def test_missing_lines_leave_the_later_phases_out():
    assert phases("\n".join(LOG.splitlines()[:3])) == {"boot_s": 3.62}
    assert phases("no timestamps here\n") == {}
