"""The `tierproxy` command: serve, tier, admin, demo."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence


def _demo(args: argparse.Namespace) -> int:
    from tierproxy.demo import run_demo

    return run_demo(duration=args.duration)


def _serve(args: argparse.Namespace) -> int:
    import asyncio

    from tierproxy.config import ConfigError, ProxySettings, load_settings
    from tierproxy.server import serve

    cli = {"bootstrap_servers": args.bootstrap_server, "listen": args.listen, "advertised_host": args.advertised_host,
           "admin_listen": args.admin_listen}
    try:
        settings = load_settings(ProxySettings, config_file=args.config, cli=cli)
    except ConfigError as exc:
        print(f"tierproxy: config error: {exc}", file=sys.stderr)
        return 2
    asyncio.run(serve(settings))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tierproxy", description=__doc__)
    parser.add_argument("--log-level", default="INFO", help="Python logging level (default INFO)")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="start a local Kafka (and tierproxy) and show how to reach it with kcat")
    demo.add_argument("--duration", type=float, default=0.0,
                      help="seconds to keep running (0 = until Ctrl-C)")
    demo.set_defaults(func=_demo)
    srv = sub.add_parser("serve", help="run the Kafka proxy in front of the brokers")
    srv.add_argument("--bootstrap-server", help="upstream brokers HOST:PORT[,..] (bootstrap.servers)")
    srv.add_argument("--listen", help="bootstrap listener HOST:PORT (listen; default 127.0.0.1:9192)")
    srv.add_argument("--advertised-host", help="host clients use to reach the proxy (advertised.host)")
    srv.add_argument("--admin-listen", help="admin HTTP listener HOST:PORT (admin.listen)")
    srv.add_argument("--config", help="properties file (key=value, Kafka-style dotted keys)")
    srv.set_defaults(func=_serve)
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
