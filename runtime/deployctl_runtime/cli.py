"""`deployctl-runtime` command line (argparse; no typer in the runtime). Subcommands: tiny-model, serve."""
from __future__ import annotations

import argparse
import sys

try:  # the server package registers `serve`; absent in an engine-only checkout
    from deployctl_runtime.server.cli import add_serve_parser
except ModuleNotFoundError as exc:
    if exc.name not in ("deployctl_runtime.server", "deployctl_runtime.server.cli"):
        raise
    add_serve_parser = None


def _tiny_model(args: argparse.Namespace) -> int:
    from deployctl_runtime.tiny_model import write_tiny_model

    path = write_tiny_model(args.dir, arch=args.arch, seed=args.seed)
    print(f"wrote a tiny {args.arch} checkpoint (seed {args.seed}) to {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="deployctl-runtime",
                                     description="The paged-KV LLM inference runtime that deployctl deploys.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    tiny = sub.add_parser("tiny-model", help="write a small HF-format checkpoint with seeded random weights")
    tiny.add_argument("dir", help="output directory (created)")
    tiny.add_argument("--arch", choices=["llama", "qwen2", "qwen3"], default="llama")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(func=_tiny_model)
    if add_serve_parser is not None:
        add_serve_parser(sub)  # registers `serve` with set_defaults(func=callable(args) -> int)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError) as exc:
        print(f"deployctl-runtime: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1
