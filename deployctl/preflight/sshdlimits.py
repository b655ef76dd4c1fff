"""Preflight's ``sshd_limits`` check: the host's sshd limits against what deployctl will ask of them.

- MaxStartups ``start:rate:full``: sshd drops unauthenticated connections over ``start`` (sshd_config(5)). deployctl
  starts up to min(rollout.parallel_hosts, the entries naming that same sshd, their hosts[].connect_rate burst:
  deployctl.hosts.startrate) connections to one sshd at once, and more than ``start`` of them is a storm that retries
  (deployctl.hosts.handshake) only ride out.
- MaxSessions: sessions (commands, SFTP) per connection; deployctl opens up to hosts[].max_channels of them
  (deployctl.hosts.ssh: one SFTP channel, the rest commands), and sshd refuses those over its limit.

The measure: ``sshd -T`` (the effective configuration) run as root, else with ``sudo -n``, with ``-C`` naming this
connection (user, addresses, port from $SSH_CONNECTION) so that Match blocks apply, and with the ``-f`` config file
the listening sshd was started with (read from its command line in /proc: the topmost sshd above this session).
Neither root nor password-less sudo, or no sshd in this session's ancestry (a non-OpenSSH server): the check passes
with a note that the limits were not read; preflight never fails for that. A config path with spaces is not found.
"""
from __future__ import annotations

from deployctl.preflight.base import Check

# Walks up from this shell to the topmost ancestor whose argv[0] is sshd or its title (the listener; its title reads
# "sshd: /usr/sbin/sshd -D -f CONFIG [listener] 0 of 10-100 startups" since OpenSSH 8.x), takes its -f and binary,
# then prints the marker and `sshd -T` as root or through sudo -n.
SCRIPT = r"""
p=$$; top=
while [ -n "$p" ] && [ "$p" -gt 1 ] 2>/dev/null; do
  a0=$(tr '\0' '\n' < /proc/$p/cmdline 2>/dev/null | head -n 1)
  case "$a0" in sshd|sshd:*|*/sshd) top=$(tr '\0' ' ' < /proc/$p/cmdline);; esac
  p=$(awk '/^PPid:/{print $2}' /proc/$p/status 2>/dev/null)
done
top=${top#sshd: }; top=${top%%\[listener\]*}
bin=; conf=; prev=
for w in $top; do
  [ -z "$bin" ] && case "$w" in /*sshd) bin=$w;; esac
  [ "$prev" = "-f" ] && conf=$w
  prev=$w
done
[ -n "$bin" ] || bin=$(command -v sshd || echo /usr/sbin/sshd)
set -- -T
[ -n "$conf" ] && set -- "$@" -f "$conf"
if [ -n "$SSH_CONNECTION" ]; then
  set -- $SSH_CONNECTION "$@"; c=$1 l=$3 lp=$4; shift 4
  set -- "$@" -C "user=$(id -un),host=$c,addr=$c,laddr=$l,lport=$lp"
fi
if [ "$(id -u)" = 0 ]; then sudo=; else sudo="sudo -n"; fi
echo "deployctl-sshd: $bin ${conf:--} ${sudo:-root}"
$sudo "$bin" "$@" 2>&1
"""


def measure(host) -> dict:
    """{"max_startups": "start:rate:full", "max_sessions": int, "config": path or None} read by ``sshd -T`` on
    ``host`` (a connected deployctl.hosts.Host), or {"error": why} when it could not be read. Raises what
    ``host.run`` raises for a lost connection."""
    res = host.run(SCRIPT, timeout=30, check=False)
    lines = res.stdout.splitlines()
    head = next((ln.split()[1:] for ln in lines if ln.startswith("deployctl-sshd: ")), ["sshd", "-", "root"])
    values = dict(ln.split(None, 1) for ln in lines if ln.startswith(("maxstartups ", "maxsessions ")))
    if "maxstartups" not in values or "maxsessions" not in values:
        why = (res.stdout.strip().splitlines() or ["no output"])[-1]
        how = "sudo -n" if head[2] != "root" else "as root"
        return {"error": f"`{head[0]} -T` ({how}) did not print them: {why}"}
    return {"max_startups": values["maxstartups"].strip(), "max_sessions": int(values["maxsessions"]),
            "config": None if head[1] == "-" else head[1]}


def sharing(cfg, host) -> list:
    """The hosts[] entries that connect to the same sshd as ``host`` (same address, port and jump), itself included."""
    key = (host.address, host.port, host.jump)
    return [h for h in cfg.hosts if (h.address, h.port, h.jump) == key]


def check_sshd_limits(cfg, host, facts: dict) -> Check:
    """Warns when deployctl's connections to ``host``'s sshd at once exceed MaxStartups' start, or its channels per
    connection (hosts[].max_channels) exceed MaxSessions; ``facts["sshd"]`` is measure()'s result."""
    got = facts["sshd"]
    if "error" in got:
        return Check("sshd_limits", "pass", f"{host.name}: sshd's MaxStartups and MaxSessions not read, so not "
                                            f"compared: {got['error']}")
    start = int(got["max_startups"].split(":")[0])
    shared = sharing(cfg, host)
    n, burst = len(shared), max(1, int(min(h.connect_rate for h in shared)))  # deployctl.hosts.startrate's burst
    at_once = min(cfg.rollout.parallel_hosts, n, burst)
    where = f"{host.name}'s sshd ({host.address}:{host.port}{', through ' + host.jump if host.jump else ''})"
    problems, fixes = [], []
    if at_once > start:
        entries = f", {n} hosts[] entries share that sshd" if n > 1 else ""
        problems.append(f"rollout.parallel_hosts {cfg.rollout.parallel_hosts}{entries}, hosts[].connect_rate "
                        f"{burst}: up to {at_once} SSH handshakes at once against MaxStartups {got['max_startups']}, "
                        f"which drops unauthenticated connections over {start}")
        fixes.append(f"set rollout.parallel_hosts or hosts[].connect_rate to {start} or less, or raise MaxStartups' "
                     f"start to {at_once} or more in that sshd_config")
    if host.max_channels > got["max_sessions"]:
        problems.append(f"hosts[].max_channels {host.max_channels} exceeds MaxSessions {got['max_sessions']} (sshd "
                        "refuses the channels over it; deployctl's SFTP channel counts as one)")
        fixes.append(f"set hosts[].max_channels for {host.name} to {got['max_sessions']} or less, or raise "
                     f"MaxSessions to {host.max_channels} in that sshd_config")
    figures = f"MaxStartups {got['max_startups']}, MaxSessions {got['max_sessions']}"
    if not problems:
        return Check("sshd_limits", "pass", f"{where}: {figures}; {at_once} connection(s) at once and "
                                            f"{host.max_channels} channels each fit")
    return Check("sshd_limits", "warn", f"{where}: " + "; ".join(problems), "; ".join(fixes))
