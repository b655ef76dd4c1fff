"""render --target systemd: the autoscale service and timer (control/) pass the real `systemd-analyze verify`, run
`deployctl autoscale --once` on the rendered deploy.yaml path, and restart a minute after each decision ends."""
from __future__ import annotations

from deployctl.render.targets import render_files, write_files
from deployctl.render.validate import verify_systemd
from support.render import make_config


def test_autoscale_units_verify_and_run_once(tmp_path):
    files = [f for f in render_files(make_config(autoscale={"window_s": "2m"}), target="systemd", release_id="r1",
                                     api_key=None) if f.path.startswith("control/")]
    paths = {p.name: p for p in write_files(files, tmp_path)}
    assert sorted(paths) == ["deployctl-chat-7b-autoscale.service", "deployctl-chat-7b-autoscale.timer"]
    for p in paths.values():
        result = verify_systemd(p)
        assert result.ok, result.output
    service = paths["deployctl-chat-7b-autoscale.service"].read_text()
    assert "ExecStart=/usr/local/bin/deployctl autoscale --once -c /etc/deployctl/chat-7b/deploy.yaml" in service
    assert "TimeoutStartSec=1920" in service  # the 2 min window + the scale action's bound
    timer = paths["deployctl-chat-7b-autoscale.timer"].read_text()
    assert "OnUnitInactiveSec=1min" in timer and "Unit=deployctl-chat-7b-autoscale.service" in timer
    # the check is real: a misspelt key fails it
    bad = tmp_path / "bad" / "deployctl-chat-7b-autoscale.timer"
    bad.parent.mkdir()
    bad.write_text(timer.replace("OnUnitInactiveSec=", "OnUnitInactiveSecs="))
    assert not verify_systemd(bad).ok
