"""The `tierproxy` command: serve, tier, admin, demo."""

from __future__ import annotations

import argparse
import logging
import ssl
import sys
from collections.abc import Sequence


def _demo(args: argparse.Namespace) -> int:
    from tierproxy.demo import run_demo

    return run_demo(duration=args.duration)


def _serve(args: argparse.Namespace) -> int:
    import asyncio

    from tierproxy.admin.app import start_admin
    from tierproxy.config import ConfigError, ProxySettings, load_settings
    from tierproxy.server import serve

    cli = {"bootstrap_servers": args.bootstrap_server, "listen": args.listen, "advertised_host": args.advertised_host,
           "admin_listen": args.admin_listen, "storage": args.storage, "metadata": args.metadata,
           "command_config": args.command_config}
    try:
        settings = load_settings(ProxySettings, config_file=args.config, cli=cli)
    except ConfigError as exc:
        print(f"tierproxy: config error: {exc}", file=sys.stderr)
        return 2
    for key, address in (("listen", settings.listen), ("admin.listen", settings.admin_listen)):
        if address is not None and (problem := _port_problem(address)) is not None:
            print(f"tierproxy: config error: {key}: {address}: {problem}", file=sys.stderr)
            return 2
    if (rc := _check_storage(settings.storage, unreachable_is_fatal=False)) is not None:
        return rc
    if settings.event_loop == "uvloop":
        import uvloop

        uvloop.run(serve(settings, services=[start_admin]))
    else:
        asyncio.run(serve(settings, services=[start_admin]))
    return 0


def _tier(args: argparse.Namespace) -> int:
    from tierproxy.config import ConfigError, TierSettings, load_settings

    cli = {"bootstrap_servers": args.bootstrap_server, "storage": args.storage, "metadata": args.metadata,
           "tier_topics": args.topics, "spark_master": args.master, "tier_interval_ms": args.interval,
           "command_config": args.command_config, "confirm_retention": True if args.confirm_retention else None}
    try:
        settings = load_settings(TierSettings, config_file=args.config, cli=cli)
        spark_conf = dict(kv.split("=", 1) for kv in args.spark_conf)
    except (ConfigError, ValueError) as exc:
        print(f"tierproxy: config error: {exc}", file=sys.stderr)
        return 2
    from tierproxy.identity.sasl import AuthenticationFailed
    from tierproxy.signals import stop_on_sigterm
    from tierproxy.tier.rlmm import WriterFenced
    from tierproxy.tiering.job import run_loop

    if (rc := _check_storage(settings.storage, unreachable_is_fatal=True)) is not None:
        return rc
    stop_on_sigterm()  # the Spark JVM and the metadata clients are stopped on the way out, as on Ctrl-C
    try:
        summaries = run_loop(settings, once=args.once, spark_conf=spark_conf, progress=not args.no_progress)
    except KeyboardInterrupt:
        print("tierproxy: tier stopped by a signal", file=sys.stderr)
        return 130
    except AuthenticationFailed as exc:  # (an OSError too: before the unreachable case)
        print(f"tierproxy: authentication failed: {exc}", file=sys.stderr)
        return 3
    except (OSError, TimeoutError) as exc:
        if isinstance(exc, ssl.SSLError):
            print(f"tierproxy: TLS toward the brokers failed ({settings.own_bootstrap}): {exc.reason or exc}",
                  file=sys.stderr)
            return 3
        print(f"tierproxy: the brokers at {settings.own_bootstrap} cannot be reached: {exc}", file=sys.stderr)
        return 6
    except WriterFenced as exc:
        print(f"tierproxy: stopped: {exc}", file=sys.stderr)
        return 4
    if summaries and summaries[-1].failed and summaries[-1].segments == 0:
        return 1
    return 5 if summaries and summaries[-1].retention_refused else 0


def _port_problem(address: str) -> str | None:
    """Why `address` (HOST:PORT) cannot be listened on, or None (a port 0 is always free)."""
    import socket

    host, _, port = address.rpartition(":")
    if int(port) == 0:
        return None
    try:
        socket.create_server((host.strip("[]") or "0.0.0.0", int(port))).close()
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _check_storage(uri: str, *, unreachable_is_fatal: bool) -> int | None:
    """Exit 2 when the storage refuses this configuration (no such bucket, credentials refused, not writable);
    an unreachable store is exit 6 for `tier` and a warning for `serve` (it relays the tail meanwhile)."""
    import asyncio

    from tierproxy.tier.storage import StorageRefused, StorageUnavailable, open_store

    async def probe() -> None:
        store, _ = open_store(uri)
        try:
            await store.probe()
        finally:
            await store.close()

    try:
        asyncio.run(probe())
    except StorageRefused as exc:
        print(f"tierproxy: config error: storage: {uri}: {exc}", file=sys.stderr)
        return 2
    except StorageUnavailable as exc:
        if unreachable_is_fatal:
            print(f"tierproxy: storage {uri} cannot be reached: {exc}", file=sys.stderr)
            return 6
        logging.getLogger("tierproxy").warning("storage %s cannot be reached yet: %s", uri, exc)
    except (OSError, ValueError) as exc:
        print(f"tierproxy: config error: storage: {uri}: {exc}", file=sys.stderr)
        return 2
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tierproxy", description=__doc__)
    parser.add_argument("--log-level", default="INFO", help="Python logging level (default INFO)")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="start a local Kafka (and tierproxy) and show how to reach it with kcat")
    demo.add_argument("--duration", type=float, default=0.0,
                      help="seconds to keep running after the walk-through (0 = until Ctrl-C, -1 = exit at once)")
    demo.set_defaults(func=_demo)
    srv = sub.add_parser("serve", help="run the Kafka proxy in front of the brokers")
    srv.add_argument("--bootstrap-server", help="upstream brokers HOST:PORT[,..] (bootstrap.servers)")
    srv.add_argument("--listen", help="bootstrap listener HOST:PORT (listen; default 127.0.0.1:9192)")
    srv.add_argument("--advertised-host", help="host clients use to reach the proxy (advertised.host)")
    srv.add_argument("--admin-listen", help="admin HTTP listener HOST:PORT (admin.listen)")
    srv.add_argument("--config", help="properties file (key=value, Kafka-style dotted keys)")
    srv.add_argument("--storage", help="file:///path or s3://bucket/prefix?endpoint=URL (storage)")
    srv.add_argument("--metadata", help="topic:[NAME] (default) or file:///dir (metadata)")
    srv.add_argument("--command-config", help="Kafka client properties: tierproxy's own identity (command.config)")
    srv.set_defaults(func=_serve)
    tier = sub.add_parser("tier", help="copy closed data from the brokers to the tier (a PySpark job)")
    tier.add_argument("--bootstrap-server", help="brokers HOST:PORT[,..] (bootstrap.servers)")
    tier.add_argument("--storage", help="file:///path or s3://bucket/prefix?endpoint=URL (storage)")
    tier.add_argument("--metadata", help="topic:[NAME] (default) or file:///dir (metadata)")
    tier.add_argument("--topics", help="regex of topics to tier (tier.topics)")
    tier.add_argument("--command-config", help="Kafka client properties: tierproxy's own identity (command.config)")
    tier.add_argument("--master", help="Spark master (spark.master; default local[*])")
    tier.add_argument("--spark-conf", action="append", default=[], metavar="K=V", help="extra Spark configuration")
    tier.add_argument("--config", help="properties file (key=value)")
    mode = tier.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="one pass, then exit")
    mode.add_argument("--interval", help="pause between passes, e.g. 30s (tier.interval.ms)")
    tier.add_argument("--no-progress", action="store_true", help="no live progress bar")
    tier.add_argument("--confirm-retention", action="store_true",
                      help="apply tier retention even where one pass deletes more than "
                      "tier.retention.max.delete.fraction of a partition (confirm.retention)")
    tier.set_defaults(func=_tier)
    from tierproxy.admin.cli import add_admin_parser

    add_admin_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for chatty in ("aiobotocore", "botocore"):  # "Found credentials in environment variables" on every start
        logging.getLogger(chatty).setLevel(max(logging.WARNING, logging.getLogger().level))
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
