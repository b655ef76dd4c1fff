"""A stand-in for ``systemd-run`` where no service manager runs (this machine's init is not systemd): it takes the
options deployctl.rollout.detach passes, refuses any other, reads EnvironmentFile= by systemd.exec(5)'s rules for
double-quoted values, and starts the command as a transient service would: its own session, stdin from /dev/null,
output appended to StandardOutput=/StandardError=, in --working-directory, with only the file's environment (and
INVOCATION_ID, as systemd sets it). With Restart=on-failure it stays behind as the unit's manager (a process of its
own session that waits on the command, as systemd.service(5) describes): a command killed by a signal other than
SIGHUP/SIGINT/SIGTERM/SIGPIPE, or ended by an exit status that is neither 0 nor in RestartPreventExitStatus=, is
started again after RestartSec=, the EnvironmentFile= read again (a missing file fails the start, as systemd's does),
while no more than StartLimitBurst= starts fall in StartLimitIntervalSec=. It records what it was given (argv, the
env file's mode, the values it parsed, every started pid in ``pids``, the first as ``pid``, each end as ``ends``) as
JSON in $STANDIN_SYSTEMD_RECORD, and exits 0 once the command started (as systemd-run does), or 1 with
$STANDIN_SYSTEMD_FAIL's text on stderr (a manager that refuses the unit)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

KNOWN_FLAGS = {"--user", "--collect", "--quiet"}
KNOWN_VALUES = ("--unit=", "--working-directory=")
KNOWN_PROPERTIES = ("EnvironmentFile=", "StandardInput=", "StandardOutput=", "StandardError=", "Restart=",
                    "RestartSec=", "RestartPreventExitStatus=", "StartLimitIntervalSec=", "StartLimitBurst=")
CLEAN_SIGNALS = {signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE}  # a clean end for Restart=


def parse_env_file(text: str) -> dict[str, str]:
    """KEY="value" lines: inside the quotes a backslash before one of "\\`$ keeps that character (systemd.exec(5),
    EnvironmentFile=); other lines are refused (deployctl writes no other form)."""
    out, pos = {}, 0
    pattern = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"\n', re.S)
    while pos < len(text):
        m = pattern.match(text, pos)
        if not m:
            raise SystemExit(f"standin systemd-run: cannot parse the env file at {text[pos:pos + 40]!r}")
        out[m.group(1)] = re.sub(r'\\(["\\`$])', r"\1", m.group(2))
        pos = m.end()
    return out


def _save(record: dict) -> None:
    tmp = os.environ["STANDIN_SYSTEMD_RECORD"] + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(record, fh)
    os.replace(tmp, os.environ["STANDIN_SYSTEMD_RECORD"])


def _start(record: dict, command: list[str]) -> subprocess.Popen:
    props = record["properties"]
    env_path = props["EnvironmentFile"]
    record["env_file_mode"] = oct(os.stat(env_path).st_mode & 0o777)  # missing: the start fails, as systemd's
    with open(env_path) as fh:
        env = parse_env_file(fh.read())
    record["env"] = env
    out = props["StandardOutput"].removeprefix("append:")
    err = props["StandardError"].removeprefix("append:")
    assert props.get("StandardInput") == "null", props
    with open(out, "ab") as o, open(err, "ab") as e, open(os.devnull, "rb") as null:
        return subprocess.Popen(command, stdin=null, stdout=o, stderr=e, cwd=record["cwd"],
                                env={**env, "INVOCATION_ID": os.urandom(16).hex()}, start_new_session=True,
                                close_fds=True)


def _restarts(props: dict, returncode: int) -> bool:
    """Whether Restart=on-failure starts the command again after it ended with ``returncode`` (Popen's)."""
    if props.get("Restart") != "on-failure":
        return False
    if returncode < 0:
        return signal.Signals(-returncode) not in CLEAN_SIGNALS
    prevent = {int(x) for x in props.get("RestartPreventExitStatus", "").split()}
    return returncode != 0 and returncode not in prevent


def _manage(record: dict, command: list[str], p: subprocess.Popen) -> None:
    """Stay the unit's manager: wait on the command, restart it by the unit's properties."""
    props = record["properties"]
    starts = [time.monotonic()]
    while True:
        rc = p.wait()
        record.setdefault("ends", []).append(rc)
        _save(record)
        if not _restarts(props, rc):
            return
        time.sleep(float(props.get("RestartSec", "0.1")))
        window = float(props.get("StartLimitIntervalSec", "10"))
        starts = [t for t in starts if time.monotonic() - t < window] + [time.monotonic()]
        if len(starts) > int(props.get("StartLimitBurst", "5")):
            record["failed"] = "start-limit-hit"
            _save(record)
            return
        try:
            p = _start(record, command)
        except OSError as exc:  # EnvironmentFile= gone: the unit fails
            record["failed"] = f"start: {exc}"
            _save(record)
            return
        record["pids"].append(p.pid)
        _save(record)


def main(argv: list[str]) -> int:
    if os.environ.get("STANDIN_SYSTEMD_FAIL"):
        print(os.environ["STANDIN_SYSTEMD_FAIL"], file=sys.stderr)
        return 1
    record: dict = {"argv": argv, "properties": {}}
    i = 0
    while argv[i] != "--":
        a = argv[i]
        if a == "-p":
            prop = argv[i + 1]
            if not prop.startswith(KNOWN_PROPERTIES):
                print(f"standin systemd-run: unknown property {prop}", file=sys.stderr)
                return 1
            k, v = prop.split("=", 1)
            record["properties"][k] = v
            i += 2
            continue
        if a not in KNOWN_FLAGS and not a.startswith(KNOWN_VALUES):
            print(f"standin systemd-run: unknown option {a}", file=sys.stderr)
            return 1
        i += 1
    command = argv[i + 1:]
    record["cwd"] = next((a.split("=", 1)[1] for a in argv[:i] if a.startswith("--working-directory=")), "/")
    if record["properties"].get("Restart", "no") == "no":
        p = _start(record, command)
        record["pid"], record["pids"] = p.pid, [p.pid]
        _save(record)
        return 0
    path = os.environ["STANDIN_SYSTEMD_RECORD"]
    if os.path.exists(path):
        os.unlink(path)
    if os.fork():  # systemd-run returns once the command started; the child stays behind as its manager
        end = time.monotonic() + 30
        while time.monotonic() < end and not os.path.exists(path):
            time.sleep(0.05)
        return 0 if os.path.exists(path) else 1
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # systemd-run's caller reads its output to the end: the manager holds none of it
        os.dup2(null, fd)
    try:
        p = _start(record, command)
        record["pid"], record["pids"] = p.pid, [p.pid]
        _save(record)
        _manage(record, command, p)
    finally:
        os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
