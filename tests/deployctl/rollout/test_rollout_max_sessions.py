"""Issue 41: a host whose sshd has MaxSessions 2, with hosts[].max_channels 2 as the refusal's own fix advises,
deploys 4 times in a row (2 of 4 deploys had a channel refused and aborted before the open was retried and SFTP's
channel counted), reached through a bastion (hosts[].jump): every deploy's SSH sessions logged in on the bastion.
The stand-in engine, real sshd and nginx."""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.timeout(400)]


def test_max_sessions_2_host_with_max_channels_2_deploys_four_times_through_a_bastion(rollout_env, ssh_fleet):
    env = rollout_env(1, engine="standin", steps=[100], pause_s=0,
                      analysis={"interval_s": 1, "min_requests": 1, "min_client_requests": 0})
    name = env.names[0]
    env.fleet.restart(name, max_sessions=2)
    env.host(name)["max_channels"] = 2
    (bastion,) = ssh_fleet(1).hosts
    env.host(name)["jump"] = f"root@127.0.0.1:{bastion.port}"
    bastion_log = bastion.dir / "sshd.log"
    releases, logins = [], [0]
    for n in range(4):
        env.cfg["engine"]["max_num_seqs"] = 3 + n  # another config hash: a new release each time
        env.write()
        r = env.cli("deploy", "--yes")
        assert r.returncode == 0, (n, r.stderr[-3000:])
        assert "MaxSessions" not in r.stderr and "refused to open" not in r.stderr, r.stderr[-3000:]
        releases.append(env.current(name))
        assert env.release_served(name) == releases[-1]
        logins.append(bastion_log.read_text().count("Accepted publickey for root"))
        assert logins[-1] > logins[-2], logins  # this deploy's connections went through the bastion
    assert len(set(releases)) == 4, releases
