"""A stand-in for ``systemd-run`` where no service manager runs (this machine's init is not systemd): it takes the
options deployctl.rollout.detach passes, refuses any other, reads EnvironmentFile= by systemd.exec(5)'s rules for
double-quoted values, and starts the command as a transient service would: its own session, stdin from /dev/null,
output appended to StandardOutput=/StandardError=, in --working-directory, with only the file's environment. It
records what it was given (argv, the env file's mode, the values it parsed, the started pid) as JSON in
$STANDIN_SYSTEMD_RECORD, and exits 0 once the command started (as systemd-run does), or 1 with
$STANDIN_SYSTEMD_FAIL's text on stderr (a manager that refuses the unit)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

KNOWN_FLAGS = {"--user", "--collect", "--quiet"}
KNOWN_VALUES = ("--unit=", "--working-directory=")
KNOWN_PROPERTIES = ("EnvironmentFile=", "StandardInput=", "StandardOutput=", "StandardError=")


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
    props = record["properties"]
    env_path = props["EnvironmentFile"]
    record["env_file_mode"] = oct(os.stat(env_path).st_mode & 0o777)
    with open(env_path) as fh:
        env = parse_env_file(fh.read())
    record["env"] = env
    wd = next((a.split("=", 1)[1] for a in argv[:i] if a.startswith("--working-directory=")), "/")
    out = props["StandardOutput"].removeprefix("append:")
    err = props["StandardError"].removeprefix("append:")
    assert props.get("StandardInput") == "null", props
    with open(out, "ab") as o, open(err, "ab") as e, open(os.devnull, "rb") as null:
        p = subprocess.Popen(command, stdin=null, stdout=o, stderr=e, env=env, cwd=wd, start_new_session=True,
                             close_fds=True)
    record["pid"] = p.pid
    with open(os.environ["STANDIN_SYSTEMD_RECORD"], "w") as fh:
        json.dump(record, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
