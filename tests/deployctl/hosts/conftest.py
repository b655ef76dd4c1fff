"""Fixtures of the host tests."""
from __future__ import annotations

import pytest

from deployctl.config import HostConfig
from deployctl.hosts import Host


@pytest.fixture
def two_hosts(ssh_fleet, tmp_path):
    """[an sshd host (user deploy), a local host]: each behaviour checked over both transports."""
    fleet = ssh_fleet(1, users="deploy")
    local = HostConfig(name="here", address="local", deploy_root=str(tmp_path / "local-root"))
    hosts = [Host.from_config(fleet.host_configs()[0]), Host.from_config(local)]
    yield hosts
    for h in hosts:
        h.close()
