"""The `tierproxy` command: serve, tier, iceberg, restore, admin, demo."""

from __future__ import annotations

import argparse
import logging
import os
import ssl
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tierproxy.cli.logs import configure as configure_logs
from tierproxy.config.distribution import pip_install

if TYPE_CHECKING:
    from tierproxy.config import ProxySettings, TierSettings
    from tierproxy.proxy.server import Proxy


def _demo(args: argparse.Namespace) -> int:
    try:
        from tierproxy.dev.demo import run_demo
    except ModuleNotFoundError:  # the wheel does not carry the developer tools (tierproxy.dev)
        print("tierproxy: `tierproxy demo` runs from a source checkout (make demo): an installed tierproxy does not "
              "carry the developer tools it needs", file=sys.stderr)
        return 2
    from tierproxy.cli.signals import stop_on_sigterm

    stop_on_sigterm()  # SIGTERM stops the demo's broker and children too, as Ctrl-C does
    return run_demo(duration=args.duration)


def _serve(args: argparse.Namespace) -> int:
    from tierproxy.cli.workers import worker_of_environment
    from tierproxy.config import ConfigError, ProxySettings, load_settings

    cli = {"bootstrap_servers": args.bootstrap_server, "listen": args.listen, "advertised_host": args.advertised_host,
           "admin_listen": args.admin_listen, "storage": args.storage, "metadata": args.metadata,
           "command_config": args.command_config, "workers": args.workers}
    try:
        settings = load_settings(ProxySettings, config_file=args.config, cli=cli)
    except ConfigError as exc:
        print(f"tierproxy: config error: {exc}", file=sys.stderr)
        return 2
    if (worker := worker_of_environment()) is not None:  # one of serve --workers N: the supervisor checked the rest
        return _serve_worker(settings, *worker)
    for key, address in (("listen", settings.listen), ("admin.listen", settings.admin_listen)):
        if address is not None and (problem := _port_problem(address)) is not None:
            print(f"tierproxy: config error: {key}: {address}: {problem}", file=sys.stderr)
            return 2
    if (rc := _check_storage(settings.storage, unreachable_is_fatal=False)) is not None:
        return rc
    if (rc := _check_owner(settings)) is not None:
        return rc
    if (count := settings.worker_count) > 1:
        if settings.listen_address[1] == 0:
            print(f"tierproxy: config error: workers={settings.workers}: needs a fixed listen port (with port 0 "
                  f"each worker would listen on a port of its own)", file=sys.stderr)
            return 2
        from tierproxy.cli.workers import Supervisor
        from tierproxy.proxy.server import CLOSE_GRACE_S

        # a worker's own watchdog ends it drain + close grace + 5 s after SIGTERM: SIGKILL only after that
        return Supervisor(args.argv, count, settings.shutdown_drain_ms / 1000 + CLOSE_GRACE_S + 10).run()
    return _serve_worker(settings, 0, 1, None)


def _serve_worker(settings: ProxySettings, index: int, count: int, pool_dir: Path | None) -> int:
    """Serve on this process's loop: the whole `serve`, or worker `index` of `count` (`pool_dir`: the workers'
    metrics directory)."""
    import asyncio
    from functools import partial

    from tierproxy.proxy.server import serve
    from tierproxy.remote.allocator import keep_freed_memory

    whole, settings = settings, settings.for_worker(index, count)
    keep_freed_memory(max(settings.remote_fetch_chunk_bytes, 4 << 20), settings.remote_fetch_cache_bytes)
    services: list[Callable[[Proxy], Coroutine[Any, Any, None]]] = []
    if settings.admin_listen:  # FastAPI and its models take ~0.4 s to import: only for a proxy that serves them
        from tierproxy.admin.app import start_admin
        from tierproxy.admin.pool import PoolRegistry

        services.append(partial(start_admin, pool=PoolRegistry(pool_dir, index) if pool_dir else None))
    elif pool_dir is not None and whole.admin_listen:  # the first worker's /metrics adds this one's
        from tierproxy.admin.pool import export_metrics

        services.append(partial(export_metrics, directory=pool_dir, index=index))
    if settings.event_loop == "uvloop":
        import uvloop

        uvloop.run(serve(settings, services=services))
    else:
        asyncio.run(serve(settings, services=services))
    from tierproxy.cli.signals import ignore_stop_signals

    ignore_stop_signals()  # stopped: the loop put the default actions back, and a late signal would end it by them
    return 0


def _job_settings(args: argparse.Namespace, cli: dict[str, Any]) -> tuple[TierSettings, dict[str, str]] | int:
    """A Spark job's settings and its extra Spark configuration; exit 2 with one line when they are wrong."""
    from tierproxy.config import ConfigError, TierSettings, load_settings

    bad = [kv for kv in args.spark_conf if "=" not in kv or not kv.split("=", 1)[0].strip()]
    if bad:
        print(f"tierproxy: config error: --spark-conf {bad[0]!r}: expected KEY=VALUE (e.g. spark.driver.memory=2g)",
              file=sys.stderr)
        return 2
    try:
        settings = load_settings(TierSettings, config_file=args.config, cli=cli)
        spark_conf = dict(kv.split("=", 1) for kv in args.spark_conf)
    except (ConfigError, ValueError) as exc:
        print(f"tierproxy: config error: {exc}", file=sys.stderr)
        return 2
    return settings, spark_conf


def _tier(args: argparse.Namespace) -> int:
    cli = {"bootstrap_servers": args.bootstrap_server, "storage": args.storage, "metadata": args.metadata,
           "tier_topics": args.topics, "spark_master": args.master, "tier_interval_ms": args.interval,
           "command_config": args.command_config, "confirm_retention": True if args.confirm_retention else None}
    loaded = _job_settings(args, cli)
    if isinstance(loaded, int):
        return loaded
    settings, spark_conf = loaded
    from tierproxy.cli.signals import stop_on_sigterm
    from tierproxy.jobs.tiering.job import run_loop

    if (rc := _check_storage(settings.storage, unreachable_is_fatal=True)) is not None:
        return rc
    stop_on_sigterm()  # the Spark JVM and the metadata clients are stopped on the way out, as on Ctrl-C
    after_pass = None
    if settings.iceberg_catalog:
        from tierproxy.jobs.iceberg.run import run_passes

        failures = [0]

        def after_pass(job: Any) -> None:
            try:
                run_passes(settings, job.spark)
            except Exception as exc:  # the tier loop goes on: tiering must not stop for the table (--once: exit code)
                if args.once:
                    raise
                failures[0] += 1
                logging.getLogger("tierproxy.jobs.iceberg").error(
                    "the Iceberg step failed (%d so far); the tier loop goes on and the next pass retries: %s: %s",
                    failures[0], type(exc).__name__, exc)
                print(f"ICEBERG STEP FAILED ({failures[0]} so far): {type(exc).__name__}: {exc}", flush=True)
    def work() -> int:
        summaries = run_loop(settings, once=args.once, spark_conf=spark_conf, progress=not args.no_progress,
                             after_pass=after_pass)
        return summaries[-1].exit_code if summaries else 0

    return _run_job("tier", settings, work)


def _run_job(name: str, settings: TierSettings, work: Callable[[], int]) -> int:
    """Run a job's work; a signal is exit 130, a known failure one line and its code (`_job_error`)."""
    try:
        return work()
    except KeyboardInterrupt:
        print(f"tierproxy: {name} stopped by a signal", file=sys.stderr)
        return 130
    except Exception as exc:
        if (rc := _job_error(exc, settings)) is not None:
            return rc
        raise


def _job_error(exc: Exception, settings: TierSettings) -> int | None:
    """A Spark job's (`tier`, `iceberg`) failures as one line and an exit code: 3 authentication or TLS refused,
    4 fenced by a newer writer, 2 another cluster's tier, two topics mapping to one typed table or a table's
    maintenance property that is no value of its kind, 7 the Iceberg catalog (unreachable, refusing, no namespace, a
    table that is not ours) or the schema registry (unreachable, refusing), 8 a segment whose bytes cannot become
    rows, 6 brokers unreachable.
    None: not one of them."""
    from tierproxy.config.identity.sasl import AuthenticationFailed
    from tierproxy.config.values import TableCollision
    from tierproxy.tier.ownership import WrongCluster
    from tierproxy.tier.rlmm import WriterFenced

    if isinstance(exc, AuthenticationFailed):  # (an OSError too: before the unreachable case)
        print(f"tierproxy: authentication failed: {exc}", file=sys.stderr)
        return 3
    if isinstance(exc, ssl.SSLError):
        print(f"tierproxy: TLS toward the brokers failed ({settings.own_bootstrap}): {exc.reason or exc}",
              file=sys.stderr)
        return 3
    kinds: list[tuple[type[Exception] | None, str, int]] = [
        (WriterFenced, "stopped: ", 4), (WrongCluster, "", 2),
        (_loaded("tierproxy.jobs.iceberg.maintenance", "BadTableProperty"), "config error: ", 2),
        (_loaded("tierproxy.jobs.iceberg.catalog", "CatalogError"), "iceberg: ", 7),
        (_loaded("tierproxy.jobs.iceberg.registry", "RegistryUnavailable"), "iceberg: ", 7),
        (_loaded("tierproxy.jobs.iceberg.run", "SegmentDataError"), "iceberg: ", 8),
        (TableCollision, "config error: ", 2)]
    for kind, prefix, code in kinds:
        if kind is not None and isinstance(exc, kind):
            print(f"tierproxy: {prefix}{exc}", file=sys.stderr)
            return code
    if isinstance(exc, (OSError, TimeoutError)):
        print(f"tierproxy: the brokers at {settings.own_bootstrap} cannot be reached: {exc}", file=sys.stderr)
        return 6
    return None


def _loaded(module: str, name: str) -> type[Exception] | None:
    """`module.name` when a job has imported `module`, else None: an exception of that type can only come from a
    job that did, and importing it here would pull the job's dependencies (numpy, for the Iceberg job's) into every
    command's error path, `restore`'s in the base install too."""
    found = getattr(sys.modules.get(module), name, None)
    return found if isinstance(found, type) and issubclass(found, Exception) else None


def _iceberg(args: argparse.Namespace) -> int:
    import json

    cli = {"bootstrap_servers": args.bootstrap_server, "storage": args.storage, "metadata": args.metadata,
           "iceberg_topics": args.topics, "spark_master": args.master, "tier_interval_ms": args.interval,
           "command_config": args.command_config, "iceberg_catalog": args.catalog, "iceberg_table": args.table,
           "iceberg_isolation_level": args.isolation, "iceberg_retention": args.retention}
    if args.action != "sync" and args.bootstrap_server is None:
        # snapshot-at, metadata-location and backfill-topic-ids use the catalog only: no broker is asked
        cli["bootstrap_servers"] = CATALOG_ONLY
    loaded = _job_settings(args, cli)
    if isinstance(loaded, int):
        return loaded
    settings, spark_conf = loaded
    from tierproxy.jobs.iceberg import run

    def work() -> int:
        if args.action == "metadata-location":
            try:
                print(run.metadata_location(settings))
            except LookupError as exc:
                print(f"tierproxy: {exc.args[0]}", file=sys.stderr)
                return 1
            return 0
        if args.action == "backfill-topic-ids":
            try:
                line, complete = run.backfill_topic_ids(settings)
            except LookupError as exc:
                print(f"tierproxy: {exc.args[0]}", file=sys.stderr)
                return 1
            print(line)
            return 0 if complete else 1
        if args.action == "snapshot-at":
            if not args.topic or not args.offsets:
                print("tierproxy: iceberg snapshot-at needs --topic and --offsets", file=sys.stderr)
                return 2
            try:
                found = run.snapshot_for_offsets(settings, args.topic, args.offsets, args.topic_id)
            except ValueError as exc:
                print(f"tierproxy: {exc}", file=sys.stderr)
                return 2
            except LookupError as exc:
                print(f"tierproxy: {exc.args[0]}", file=sys.stderr)
                return 1
            print(json.dumps(found))
            return 0 if found.get("snapshot_id") is not None else 1
        if (rc := _check_storage(settings.storage, unreachable_is_fatal=True)) is not None:
            return rc
        from tierproxy.cli.signals import stop_on_sigterm
        from tierproxy.jobs.tiering.job import JobSpark

        stop_on_sigterm()
        spark = JobSpark("tierproxy-iceberg", settings.spark_master, spark_conf)
        try:
            run.run_loop(settings, spark, once=args.once)
        finally:
            spark.close()
        return 0

    return _run_job("iceberg", settings, work)


CATALOG_ONLY = "catalog-only.invalid:9"  # bootstrap.servers of a command that asks no broker (never dialled)


def _restore(args: argparse.Namespace) -> int:
    cli = {"bootstrap_servers": args.bootstrap_server, "storage": args.storage, "metadata": args.metadata,
           "command_config": args.command_config}
    loaded = _job_settings(args, cli)
    if isinstance(loaded, int):
        return loaded
    settings, _ = loaded
    if (rc := _check_storage(settings.storage, unreachable_is_fatal=True)) is not None:
        return rc
    metrics = Path(args.metrics_file) if args.metrics_file else None
    if metrics is not None and (why := _metrics_file_problem(metrics, args.dry_run)):
        print(f"tierproxy: --metrics-file={args.metrics_file}: {why}", file=sys.stderr)
        return 2
    from tierproxy.jobs.restore.epochs import EpochsNotRaised
    from tierproxy.jobs.restore.fill import FillFailed, ForeignRecords
    from tierproxy.jobs.restore.plan import RestoreRefused
    from tierproxy.jobs.restore.run import Restore

    def work() -> int:
        try:
            report = Restore(settings, args.topics or ".*", args.dry_run, accept_missing=args.accept_missing).run()
        except RestoreRefused as exc:
            print(f"tierproxy: restore refused: {exc}", file=sys.stderr)
            return 2
        except ForeignRecords as exc:  # running it again changes nothing until the other writer is dealt with
            print(f"tierproxy: restore stopped: {exc}", file=sys.stderr)
            return 1
        except (EpochsNotRaised, FillFailed) as exc:
            print(f"tierproxy: restore stopped (run it again to go on): {exc}", file=sys.stderr)
            return 1
        for line in report.lines():
            print(line, flush=True)
        if report.drill is not None and metrics is not None:
            from tierproxy.jobs.restore.drill import prometheus_text, write_metrics

            write_metrics(metrics, prometheus_text(report.drill, time.time()))
        if report.drill is not None and (report.drill.broken or report.drill.unrecorded):
            print("tierproxy: restore drill: a restore now would not have everything the tier should hold (above)",
                  file=sys.stderr)
            return 1
        if report.groups.get("failed"):
            print("tierproxy: restore: some group offsets were not committed (above); run it again to go on",
                  file=sys.stderr)
            return 1
        return 0

    return _run_job("restore", settings, work)


def _metrics_file_problem(path: Path, dry_run: bool) -> str | None:
    """Why the drill's findings cannot be written to `path`, or None."""
    if not dry_run:
        return "the drill's findings are written by a dry run: add --dry-run"
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        return f"its directory {parent} does not exist"
    if not os.access(parent, os.W_OK):
        return f"its directory {parent} is not writable"
    return None


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


def _failure_of(probe: Callable[[], Coroutine[Any, Any, None]]) -> Exception | None:
    """Run a start-up check on its own event loop; what it raised, if anything."""
    import asyncio

    def quiet_interrupt(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # a task the user's Ctrl-C ended: the interrupt goes on to `main` (one line); asyncio would log the task
        # as an exception never retrieved, with a traceback
        if not isinstance(context.get("exception"), KeyboardInterrupt):
            loop.default_exception_handler(context)

    try:
        with asyncio.Runner() as runner:
            runner.get_loop().set_exception_handler(quiet_interrupt)
            runner.run(probe())
    except Exception as exc:
        return exc
    return None


def _check_owner(settings: Any) -> int | None:
    """Exit 2 when the tier belongs to another cluster than the brokers' (`tier.ownership`), asked on the proxy's
    own connections (its identity and TLS). Brokers that cannot be asked yet are let through with a warning: the
    proxy relays the tail meanwhile, and its remote tier checks again before it serves anything."""
    from tierproxy.remote.leaders import OwnLeaders
    from tierproxy.tier.ownership import WrongCluster, check_cluster
    from tierproxy.tier.rsm import RemoteStorageManager

    async def check() -> None:
        leaders, rsm = OwnLeaders(settings), RemoteStorageManager.from_uri(settings.storage)
        try:
            await check_cluster(rsm, await leaders.cluster_id(), record=False, brokers=settings.own_bootstrap)
        finally:
            await rsm.close()
            await leaders.close()

    failure = _failure_of(check)
    if isinstance(failure, WrongCluster):
        print(f"tierproxy: {failure}", file=sys.stderr)
        return 2
    if failure is not None:  # any other reason: checked again by the remote tier before it serves
        logging.getLogger("tierproxy").warning("which cluster the tier belongs to was not checked yet: %s: %s",
                                               type(failure).__name__, failure)
    return None


def _check_storage(uri: str, *, unreachable_is_fatal: bool) -> int | None:
    """Exit 2 when the storage refuses this configuration (no such bucket, credentials refused, not writable);
    an unreachable store is exit 6 for `tier` and a warning for `serve` (it relays the tail meanwhile)."""
    from tierproxy.tier.storage import StorageRefused, StorageUnavailable, open_store

    async def probe() -> None:
        store, _ = open_store(uri)
        try:
            await store.probe()
        finally:
            await store.close()

    failure = _failure_of(probe)
    if failure is None:
        return None
    if isinstance(failure, StorageUnavailable) and not isinstance(failure, StorageRefused):
        if unreachable_is_fatal:
            print(f"tierproxy: storage {uri} cannot be reached: {failure}", file=sys.stderr)
            return 6
        logging.getLogger("tierproxy").warning("storage %s cannot be reached yet: %s", uri, failure)
        return None
    if isinstance(failure, (StorageRefused, OSError, ValueError)):
        print(f"tierproxy: config error: storage: {uri}: {failure}", file=sys.stderr)
        return 2
    raise failure


def _spark_job_args(job: argparse.ArgumentParser) -> None:
    """What `tier` and `iceberg` share as PySpark jobs: tierproxy's identity, Spark, a config file, once or a loop."""
    job.add_argument("--command-config", help="Kafka client properties: tierproxy's own identity (command.config)")
    job.add_argument("--master", help="Spark master (spark.master; default local[*])")
    job.add_argument("--spark-conf", action="append", default=[], metavar="K=V", help="extra Spark configuration")
    job.add_argument("-c", "--config", help="properties file (key=value)")
    mode = job.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="one pass, then exit")
    mode.add_argument("--interval", help="pause between passes, e.g. 30s (tier.interval.ms)")


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
    srv.add_argument("-c", "--config", help="properties file (key=value, Kafka-style dotted keys)")
    srv.add_argument("--storage", help="file:///path or s3://bucket/prefix?endpoint=URL (storage)")
    srv.add_argument("--metadata", help="topic:[NAME] (default) or file:///dir (metadata)")
    srv.add_argument("--command-config", help="Kafka client properties: tierproxy's own identity (command.config)")
    srv.add_argument("--workers", help="processes serving the same ports, N or auto: one per core (workers; "
                     "default 1)")
    srv.set_defaults(func=_serve)
    tier = sub.add_parser("tier", help="copy closed data from the brokers to the tier (a PySpark job)")
    tier.add_argument("--bootstrap-server", help="brokers HOST:PORT[,..] (bootstrap.servers)")
    tier.add_argument("--storage", help="file:///path or s3://bucket/prefix?endpoint=URL (storage)")
    tier.add_argument("--metadata", help="topic:[NAME] (default) or file:///dir (metadata)")
    tier.add_argument("--topics", help="regex of topics to tier (tier.topics)")
    _spark_job_args(tier)
    tier.add_argument("--no-progress", action="store_true", help="no live progress bar")
    tier.add_argument("--confirm-retention", action="store_true",
                      help="apply tier retention even where one pass deletes more than "
                      "tier.retention.max.delete.fraction of a partition (confirm.retention)")
    tier.set_defaults(func=_tier)
    ice = sub.add_parser("iceberg", help="the tier as an Apache Iceberg table (a PySpark job), or snapshot-at")
    ice.add_argument("action", nargs="?", default="sync", choices=["sync", "snapshot-at", "metadata-location",
                                                                  "backfill-topic-ids"],
                     help="sync (default): add what is tiered and follow the tier; snapshot-at: the first "
                     "snapshot holding --topic up to --offsets; metadata-location: the table's current metadata "
                     "file (what DuckDB's iceberg_scan reads); backfill-topic-ids: once, the topic id of --table's "
                     "rows written before that column")
    ice.add_argument("--bootstrap-server", help="brokers HOST:PORT[,..] (bootstrap.servers)")
    ice.add_argument("--storage", help="the tier: file:///path or s3://bucket/prefix?endpoint=URL (storage)")
    ice.add_argument("--metadata", help="topic:[NAME] (default) or file:///dir (metadata)")
    ice.add_argument("--catalog", help="embedded (default), sqlite:///path, a SQLAlchemy URL or rest:https://... "
                     "(iceberg.catalog)")
    ice.add_argument("--table", help="NAMESPACE.TABLE (iceberg.table; default kafka.history)")
    ice.add_argument("--topics", help="regex of topics in the table (iceberg.topics; default tier.topics)")
    ice.add_argument("--isolation", choices=["read_committed", "read_uncommitted"],
                     help="iceberg.isolation.level (default read_committed: aborted transactions never rows)")
    ice.add_argument("--retention", choices=["follow", "keep"],
                     help="iceberg.retention: follow (default) removes rows the tier deletes; keep keeps them")
    _spark_job_args(ice)
    ice.add_argument("--topic", help="snapshot-at: the topic")
    ice.add_argument("--offsets", help='snapshot-at: {"partition": offset, ...}')
    ice.add_argument("--topic-id", help="snapshot-at: the topic's incarnation (its topic id; default: the table's "
                                        "current one; `--retention keep` keeps a re-created topic's older ones)")
    ice.set_defaults(func=_iceberg)
    rst = sub.add_parser("restore", help="the tier's history into a new cluster, every offset kept")
    rst.add_argument("--bootstrap-server", help="the NEW cluster's brokers HOST:PORT[,..] (bootstrap.servers)")
    rst.add_argument("--storage", help="the tier: file:///path or s3://bucket/prefix?endpoint=URL (storage)")
    rst.add_argument("--metadata", help="the new cluster's metadata: topic:[NAME] (default) (metadata)")
    rst.add_argument("--topics", help="regex of topics to restore (default: every topic in the snapshot)")
    rst.add_argument("--dry-run", action="store_true",
                     help="plan and check only, change nothing; also reads every segment's objects and reports "
                          "what a restore now would lose (against the tiered cluster itself: the drill)")
    rst.add_argument("--metrics-file", help="with --dry-run: write the drill's findings there in Prometheus' "
                                            "text format (for node_exporter's textfile collector)")
    rst.add_argument("--accept-missing", action="store_true",
                     help="go on without the facts no kept tier snapshot holds whole (named by the refusal)")
    rst.add_argument("--command-config", help="Kafka client properties: tierproxy's own identity (command.config)")
    rst.add_argument("-c", "--config", help="properties file (key=value)")
    rst.set_defaults(func=_restore, spark_conf=[])
    from tierproxy.admin.cli import add_admin_parser

    add_admin_parser(sub)
    for command in sub.choices.values():  # also after the command, as Kafka's tools take every option anywhere
        command.add_argument("--log-level", default=argparse.SUPPRESS, help="Python logging level (default INFO)")
    return parser


# the commands that need an extra (`pip install 'kafka-tierproxy[EXTRA]'`) and the modules that make it up; `serve`,
# `admin` and `restore` need none (`demo` runs from a checkout, where `make install` installs every extra)
EXTRAS = {"tier": ("tier", ("pyspark", "pyarrow", "numpy", "numba")),
          "iceberg": ("iceberg", ("pyspark", "pyarrow", "numpy", "numba", "pyiceberg", "fastavro", "google.protobuf"))}


def _installed(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module without a spec
        return False


def missing_extra(command: str) -> str | None:
    """One line naming the extra `command` needs and how to install it, or None when it is installed."""
    extra, modules = EXTRAS.get(command, ("", ()))
    missing = [m for m in modules if not _installed(m)]
    if not missing:
        return None
    return f"`tierproxy {command}` needs the {extra} extra ({', '.join(missing)} not installed): {pip_install(extra)}"


def main(argv: Sequence[str] | None = None) -> int:
    """The `tierproxy` command. The first SIGINT or SIGTERM stops it wherever it is, later ones are ignored
    (`cli.signals`; `serve`'s event loop takes them over while it runs): one that lands before a command handles it
    (in its imports, settings or start-up checks) is one line and exit 130, never a traceback."""
    from tierproxy.cli.signals import forget_interrupt_in_exec, ignore_stop_signals, stop_children, stop_on_sigterm

    stop_on_sigterm()
    rc = 1
    try:
        rc = _main(argv)
        return rc
    except KeyboardInterrupt:
        forget_interrupt_in_exec()  # exit 130 as said, not by SIGINT
        print("tierproxy: stopped by a signal", file=sys.stderr)
        rc = 130
        return rc
    finally:
        ignore_stop_signals()  # before the interpreter's finalization puts the default actions back
        if rc == 130 and argv is None:  # the process's own command, stopped by a signal: nothing it started
            stop_children()              # outlives it (called with arguments, from Python: not its process)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logs(args.log_level, os.environ.get("_TIERPROXY_WORKER"))  # serve --workers N: which worker says what
    if (missing := missing_extra(args.command)) is not None:
        print(f"tierproxy: {missing}", file=sys.stderr)
        return 2
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what serve's workers run again
    rc: int = args.func(args)
    return rc

