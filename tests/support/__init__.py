"""Test support, loaded as a pytest plugin (tests/conftest.py: ``pytest_plugins``): free ports, the CLI run in a
fresh interpreter or in-process, the sshd fleet, nginx, the rollout environment, render and runbook helpers.

- ``ports``   free_port
- ``cli``     deployctl (subprocess), run_cli (in-process), repo_env
- ``sshd``    ssh_fleet: real sshd daemons on loopback, a client key, known_hosts
- ``nginx``   nginx_router: a real nginx under its own prefix
- ``rollout`` rollout_env: sshd fleet + nginx + the runtime on CPU with the tiny model
- ``render``  deploy.yaml builders for the render tests
- ``runbook_fleet`` a deploy.yaml for fleet hosts, stand-in releases, the audit log
"""
