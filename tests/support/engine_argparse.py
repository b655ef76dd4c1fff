"""Run inside .venv-engines (tests/setup_test_venvs.sh): parse engine command lines with the engines' own argument parsers.

    python engine_argparse.py vllm|sglang < commands.json

stdin: a JSON list of argv lists (the arguments after the engine's program: ``serve MODEL ...`` for vLLM, the
flags of ``sglang.launch_server`` for SGLang). stdout: a JSON list with, per argv, either
``{"ok": true, "options": {option: [dest, value]}, "positional": value}`` or ``{"ok": false, "exit": code,
"error": text}``. A helper for tests/deployctl/engines/test_engines_parsers.py, not a test file.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def _vllm():
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    root = FlexibleArgumentParser(prog="vllm")
    serve = ServeSubcommand().subparser_init(root.add_subparsers(dest="subparser"))
    return root, serve, "model_tag"


def _sglang():
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    return parser, parser, None


def _jsonable(v):
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v if isinstance(v, (str, int, float, bool, type(None))) else repr(v)


def main() -> None:
    kind = sys.argv[1]
    root, leaf, positional = {"vllm": _vllm, "sglang": _sglang}[kind]()
    out = []
    for argv in json.load(sys.stdin):
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ns = root.parse_args(argv)
        except SystemExit as exc:
            out.append({"ok": False, "exit": exc.code, "error": err.getvalue().strip()[-400:]})
            continue
        options = {}
        for word in argv:
            name = word.split("=", 1)[0]
            action = leaf._option_string_actions.get(name)
            if action is not None:
                options[name] = [action.dest, _jsonable(getattr(ns, action.dest))]
        out.append({"ok": True, "options": options,
                    "positional": _jsonable(getattr(ns, positional)) if positional else None})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
