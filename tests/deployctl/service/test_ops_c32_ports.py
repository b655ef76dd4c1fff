"""C32 (issue 21) on plain data: which port a runtime serves on after a rollback onto ``hosts[].spare_port``, the
alternation of the two ports, that a release still renders the configured port while nginx follows the active one,
and that a spare_port equal to server_port is refused. The fleet behaviour is test_ops_c32_rollback_beside.py."""
from __future__ import annotations

import pytest
import yaml

from deployctl.config import parse_config
from deployctl.config.layout import configured_port, service_port
from deployctl.errors import ConfigError
from deployctl.render import render_nginx, render_release
from deployctl.service import launcher


def _cfg(**host):
    doc = {"service": {"name": "svc"}, "model": {"path": "/m"},
           "hosts": [{"name": "a", "address": "127.0.0.1", "deploy_root": "/d/a", "launcher": "process",
                      "server_port": 8001, **host}],
           "router": {"host": "local", "listen": 8080, "listen_address": "127.0.0.1",
                      "upstream_conf": "/tmp/unused/llm.conf"}}
    return parse_config(yaml.safe_dump(doc, sort_keys=False), "test-deploy.yaml")


def test_the_two_ports_alternate_and_the_pidfile_link_names_the_active_one():
    cfg = _cfg(spare_port=9001)
    h = cfg.hosts[0]
    assert (service_port(cfg, h), launcher.beside_port(cfg, h)) == (8001, 9001)
    assert launcher.remember_port(h, "runtime.9001.pid\n") == 9001  # after a rollback onto the spare port
    assert (service_port(cfg, h), configured_port(cfg, h), launcher.beside_port(cfg, h)) == (9001, 8001, 8001)
    assert launcher.remember_port(h, "runtime.8001.pid") == 8001  # the next rollback went back
    assert launcher.beside_port(cfg, h) == 9001
    assert launcher.remember_port(h, "") is None and service_port(cfg, h) == 8001  # a plain pidfile: configured
    assert launcher.beside_port(cfg, _cfg().hosts[0]) is None  # no spare_port: no start beside


def test_a_release_renders_the_configured_port_and_nginx_the_active_one():
    cfg = _cfg(spare_port=9001)
    h = cfg.hosts[0]
    launcher.remember_port(h, "runtime.9001.pid")
    files = {f.path: f.content for f in render_release(cfg, h, "20261201T000000Z-abcdef12", api_key=None)}
    assert "port: 8001" in files["runtime.yaml"] and "9001" not in files["runtime.yaml"]
    assert "DEPLOYCTL_LAUNCH_PORT" in files["launch.sh"]
    conf = render_nginx(cfg, stable=[h], canary=[], canary_weight=0)
    assert "127.0.0.1:9001" in conf and "127.0.0.1:8001" not in conf


def test_spare_port_equal_to_server_port_is_refused():
    with pytest.raises(ConfigError) as exc:
        _cfg(spare_port=8001)
    assert "spare_port 8001 is the host's server_port" in str(exc.value)



def test_a_process_that_never_read_the_host_renders_the_port_the_last_split_routed(tmp_path):
    """`router reload` and a runbook's drain re-render every host without reading each one's pidfile link: the
    router's state file (written by Router.apply) carries each host's port, so nginx keeps pointing at the spare
    port a rollback left the runtime on; a host whose port was read in this process keeps what was read."""
    import json

    from deployctl.hosts import Host
    from deployctl.rollout.router import Router, router_host_config

    conf = tmp_path / "llm.conf"
    (tmp_path / "llm.conf.state.json").write_text(json.dumps(
        {"stable": ["a"], "canary": [], "weight": 0, "drained": [], "ports": {"a": 9001}}))

    def router(cfg):
        cfg = cfg.model_copy(update={"router": cfg.router.model_copy(update={"upstream_conf": str(conf)})})
        return Router(cfg, Host.from_config(router_host_config(cfg)))

    cfg = _cfg(spare_port=9001)
    r = router(cfg)
    h = r.cfg.hosts[0]
    assert service_port(r.cfg, h) == 8001  # nothing read yet
    assert r.read_split()["ports"] == {"a": 9001} and service_port(r.cfg, h) == 9001
    text = render_nginx(r.cfg, stable=[h], canary=[], canary_weight=0)
    assert "127.0.0.1:9001" in text and "127.0.0.1:8001" not in text

    r = router(_cfg(spare_port=9001))
    launcher.remember_port(r.cfg.hosts[0], "")  # read from the host this time: a plain pidfile, the configured port
    r.read_split()
    assert service_port(r.cfg, r.cfg.hosts[0]) == 8001
