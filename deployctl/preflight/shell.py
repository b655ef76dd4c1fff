"""Preflight's ``login_shell`` check: the time a host's login shell takes before each remote command starts.

sshd runs every command as ``$SHELL -c COMMAND``, and Debian's and Ubuntu's bash source ``~/.bashrc`` for commands
that arrive over SSH although they are not interactive (bash(1), INVOCATION: a shell run by sshd reads ~/.bashrc).
An rc file that runs ``pyenv init``, conda's block or nvm before its interactive guard charges that time to every
command, and a deploy runs 20-30 of them per host. Measured on this project's test machine, whose /root/.bashrc
runs pyenv init with no guard: ~0.3 s per command idle, ~1 s with 8 hosts deploying at once (pyenv's rehash lock
serialises them); bench/bench_fleet.py's first deploy of 8 hosts took 24.6 s with it and 4.5 s without.

The measure: the fastest of ``SAMPLES`` runs of ``true`` (a channel, the shell, its exit) against the fastest of
``SAMPLES`` SFTP stats on the open SFTP channel (one round trip, no shell). An exec costs about three round trips
(channel open, exec request, exit status), so shell time = command − 3 × round trip. Local hosts run commands
without SSH or a login shell: they are not measured and get no login_shell check.
"""
from __future__ import annotations

import time

from deployctl.preflight.base import Check

SAMPLES = 3
WARN_S = 0.2  # seconds of shell start-up per command; pyenv, conda or nvm init costs 0.1-1 s; a bare bash ~3 ms
ROUND_TRIPS_PER_COMMAND = 3


def measure(host) -> dict:
    """{"command_s", "round_trip_s"}: the fastest of SAMPLES runs of ``true`` and of SFTP stats of deploy_root, in
    seconds. ``host`` is a connected deployctl.hosts.Host; raises what its run() and exists() raise."""
    root = host.config.deploy_root
    host.exists(root)  # opens the SFTP channel, so the timed stats are one round trip each

    def fastest(fn) -> float:
        best = float("inf")
        for _ in range(SAMPLES):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        return best

    return {"round_trip_s": round(fastest(lambda: host.exists(root)), 4),
            "command_s": round(fastest(lambda: host.run("true", timeout=30)), 4)}


def shell_seconds(measured: dict) -> float:
    """Seconds the login shell adds to each command (see the module doc), never below 0."""
    return max(0.0, measured["command_s"] - ROUND_TRIPS_PER_COMMAND * measured["round_trip_s"])


def check_login_shell(host, facts: dict) -> Check:
    """Warns when the login shell of ``host`` (a HostConfig) adds more than WARN_S to every command; ``facts`` holds
    measure()'s result under "login_shell" (gather puts it there for SSH hosts)."""
    measured = facts["login_shell"]
    if "error" in measured:
        return Check("login_shell", "warn", f"{host.name}: the login shell's start-up time was not measured: "
                                            f"{measured['error']}")
    shell = shell_seconds(measured)
    numbers = (f"{host.name}: `true` takes {measured['command_s'] * 1e3:.0f} ms, an SFTP round trip "
               f"{measured['round_trip_s'] * 1e3:.1f} ms: the login shell adds ~{shell * 1e3:.0f} ms to every remote "
               "command")
    if shell <= WARN_S:
        return Check("login_shell", "pass", numbers)
    return Check("login_shell", "warn",
                 f"{numbers}; a deploy runs 20-30 commands per host, so it adds ~{25 * shell:.0f} s per host, "
                 "and more when hosts deploy at once",
                 fix=f"on {host.name}, make the login shell's startup files return early for non-interactive "
                     "shells: bash sources ~/.bashrc for SSH commands, so put `case $- in *i*) ;; *) return;; esac` "
                     "above pyenv/conda/nvm init there (Debian's and Ubuntu's default ~/.bashrc starts with it)")
