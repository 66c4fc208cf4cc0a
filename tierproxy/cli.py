"""The `tierproxy` command: serve, tier, admin, demo."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence


def _demo(args: argparse.Namespace) -> int:
    from tierproxy.demo import run_demo

    return run_demo(duration=args.duration)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tierproxy", description=__doc__)
    parser.add_argument("--log-level", default="INFO", help="Python logging level (default INFO)")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="start a local Kafka (and tierproxy) and show how to reach it with kcat")
    demo.add_argument("--duration", type=float, default=0.0,
                      help="seconds to keep running (0 = until Ctrl-C)")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
