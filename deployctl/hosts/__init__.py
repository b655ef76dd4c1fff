"""Hosts: run commands and move files on a deploy.yaml host, locally or over SSH.

- ``base``        RunResult, the host errors (RemoteError, exit 4), command-line quoting helpers.
- ``host``        Host (one host, its transport chosen by address), run_on_hosts (a bounded thread pool).
- ``local``       the transport for ``address: local`` (subprocess).
- ``ssh``         the SSH transport (the only fabric import).
- ``known_hosts`` SSH host-key trust (known_hosts files, reject policy, fingerprints).

Import from this package (``from deployctl.hosts import Host``); it never imports fabric or paramiko itself.
"""
from deployctl.hosts.base import (Argv, AuthFailed, CommandTimeout, HostDeadline, HostError, HostKeyChanged, HostKeyUnknown,
                                  HostUnreachable, RemoteCommandError, RunResult, SudoPasswordRequired, command_line,
                                  known_hosts_path, short_command, tail)
from deployctl.hosts.host import Host, HostOutcome, run_on_hosts

__all__ = ["Argv", "AuthFailed", "CommandTimeout", "Host", "HostDeadline", "HostError", "HostKeyChanged", "HostKeyUnknown",
           "HostOutcome", "HostUnreachable", "RemoteCommandError", "RunResult", "SudoPasswordRequired", "command_line",
           "known_hosts_path", "run_on_hosts", "short_command", "tail"]
