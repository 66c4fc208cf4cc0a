"""`tierproxy admin status|partitions TOPIC|segments TOPIC P|tier-now`: the admin API as rich tables."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import httpx
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table


def add_admin_parser(sub: Any) -> None:
    admin = sub.add_parser("admin", help="query and drive a running proxy's admin API")
    admin.add_argument("--url", default=os.environ.get("TIERPROXY_ADMIN_URL", "http://127.0.0.1:9180"),
                       help="admin API base URL (env TIERPROXY_ADMIN_URL)")
    admin.add_argument("--token", default=os.environ.get("TIERPROXY_ADMIN_TOKEN"), help="bearer token")
    cmds = admin.add_subparsers(dest="admin_command", required=True)
    st = cmds.add_parser("status", help="health, remote fetch and the cluster's topics")
    st.add_argument("--internal", action="store_true",
                    help="list internal topics too (never tiered: the broker's own, tierproxy's metadata topic)")
    p = cmds.add_parser("partitions", help="where each partition's data lives")
    p.add_argument("topic")
    s = cmds.add_parser("segments", help="remote segments of a partition")
    s.add_argument("topic")
    s.add_argument("partition", type=int)
    cmds.add_parser("iceberg", help="the Iceberg table: per partition the tier's end, the table's end, the lag")
    t = cmds.add_parser("tier-now", help="ask the running tier job for a pass now and wait for it")
    t.add_argument("--wait", type=_seconds, default=60.0, metavar="DURATION",
                   help="how long a tier job has to take the request (e.g. 60s, 2m; default 60s): then it is "
                   "withdrawn and the command fails")
    t.add_argument("--timeout", type=float, default=600, help="seconds the pass may take once a job took it")
    admin.set_defaults(func=run_admin)


def _forever(n: int) -> str:
    return "-1 (forever)" if n < 0 else str(n)


def _get(client: httpx.Client, path: str) -> Any:
    r = client.get(path)
    if r.status_code >= 400:
        try:
            why = r.json().get("error", r.text)
        except ValueError:  # not the admin API's JSON (a proxy or an ingress in front of it answered)
            why = r.text.strip().splitlines()[0] if r.text.strip() else r.reason_phrase
        raise SystemExit(f"tierproxy: admin: {path}: HTTP {r.status_code}: {why}")
    return r.json()


def _console() -> Console:
    """A terminal's width for a terminal; piped or redirected, each table at its full width (rich would cut it to
    80 columns), unless COLUMNS says otherwise."""
    import sys

    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console()
    return Console(width=10_000)


def _url_problem(url: str) -> str | None:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "not an http:// or https:// URL (e.g. http://127.0.0.1:9180)"
    try:
        parts.port  # noqa: B018 (a port that is not a number raises here)
    except ValueError as exc:
        return str(exc)
    return None


def run_admin(args: argparse.Namespace, console: Console | None = None) -> int:
    """One admin command; a URL that is not one is exit 2, an admin API that cannot be reached (or TLS toward it
    fails) one line naming the URL (exit 6)."""
    import logging
    import ssl
    import sys

    if (problem := _url_problem(args.url)) is not None:
        print(f"tierproxy: config error: --url (TIERPROXY_ADMIN_URL) {args.url!r}: {problem}", file=sys.stderr)
        return 2
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request in a command's output
    try:
        return _run_admin(args, console or _console())
    except httpx.TransportError as exc:
        cause = exc.__cause__ or exc.__context__
        while cause is not None and not isinstance(cause, ssl.SSLError):
            cause = cause.__cause__ or cause.__context__
        if isinstance(cause, ssl.SSLError):
            why = ": ".join(str(w) for w in (cause.reason, getattr(cause, "verify_message", None)) if w)
            print(f"tierproxy: admin: TLS toward {args.url} failed: {why or cause} (a CA of your own: "
                  "SSL_CERT_FILE)", file=sys.stderr)
        else:
            print(f"tierproxy: admin: no admin API answers at {args.url} ({type(exc).__name__}: {exc}); is "
                  "`tierproxy serve` running with admin.listen set? (--url or TIERPROXY_ADMIN_URL)", file=sys.stderr)
        return 6


def _run_admin(args: argparse.Namespace, console: Console) -> int:
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    with httpx.Client(base_url=args.url, headers=headers, timeout=30) as client:
        if args.admin_command == "status":
            ready = client.get("/readyz").json()
            rf = _get(client, "/v1/remote-fetch")
            console.print(f"[bold]ready[/bold]: {ready['ready']} {' '.join(ready['problems'])}")
            ratio = "-" if rf["cache_hit_ratio"] is None else f"{rf['cache_hit_ratio']:.0%}"
            console.print(f"[bold]remote fetch[/bold]: enabled={rf['enabled']} ready={rf['ready']} "
                          f"purgatory={rf['purgatory']} pool={rf['pool_running']}/{rf['pool_threads']} busy, "
                          f"{rf['pool_queued']} queued, {rf['rejected']} rejected, {rf['expired']} expired, "
                          f"cache hit ratio {ratio}")
            table = Table("topic", "partitions", "tiered segments", "tiered MB", "tier retention.ms",
                          "tier retention.bytes", "restored from")
            for t in _get(client, "/v1/topics?internal=true" if args.internal else "/v1/topics"):
                table.add_row(t["topic"], str(t["partitions"]), str(t["tiered_segments"]),
                              f"{t['tiered_bytes'] / 1e6:.1f}", _forever(t["tier_retention_ms"]),
                              _forever(t["tier_retention_bytes"]), t.get("restored_from_cluster") or "")
            console.print(table)
        elif args.admin_command == "partitions":
            table = Table("partition", "leader", "broker log start", "high watermark", "tier start", "purged below",
                          "tier end", "segments", "tier MB", "lag", "gap", title=args.topic)
            for p in _get(client, f"/v1/topics/{args.topic}/partitions"):
                gap = f"{p['gap'][0]}..{p['gap'][1]}" if p["gap"] else ""
                table.add_row(*(str(x) if x is not None else "-" for x in (
                    p["partition"], p["leader"], p["broker_log_start"], p["high_watermark"], p["tier_start"],
                    p["purged_below"], p["tier_end"], p["segments"], f"{p['tier_bytes'] / 1e6:.1f}",
                    p["tiering_lag"])), gap)
            console.print(table)
        elif args.admin_command == "segments":
            table = Table("segment id", "start", "end", "max timestamp", "bytes", "state", "epochs",
                          title=f"{args.topic}-{args.partition}")
            for s in _get(client, f"/v1/topics/{args.topic}/partitions/{args.partition}/segments"):
                table.add_row(s["segment_id"], str(s["start_offset"]), str(s["end_offset"]),
                              str(s["max_timestamp_ms"]), str(s["size_bytes"]), s["state"],
                              " ".join(f"{e}@{o}" for e, o in s["leader_epochs"].items()))
            console.print(table)
        elif args.admin_command == "iceberg":
            st = _get(client, "/v1/iceberg")
            when = "-" if st.get("last_commit_ms") is None else \
                time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(st["last_commit_ms"] / 1000)) + " UTC"
            console.print(f"[bold]{st['table']}[/bold] in {st['catalog']}: " + (
                f"snapshot {st['snapshot_id']} committed {when}, {st['files']} files, {st['rows']} rows, "
                f"lag {st['lag_offsets']} offsets; {st.get('live_bytes', 0)} bytes live, {st.get('disk_bytes', 0)} on "
                f"disk, {st.get('snapshots', 0)} snapshots, {st.get('manifests', 0)} manifests" if st["exists"]
                else "not created yet (no pass has run)"))
            table = Table("topic", "partition", "tier end", "table end", "lag")
            for p in st["partitions"]:
                table.add_row(p["topic"], str(p["partition"]), str(p["tier_end"]), str(p["table_end"]), str(p["lag"]))
            console.print(table)
            if st.get("typed"):
                typed = Table("typed table", "topic", "rows", "dead letters", "lag")
                for t in st["typed"]:
                    typed.add_row(t["table"], t["topic"], str(t["rows"]) if t["exists"] else "not created yet",
                                  str(t["dead_letters"]), str(t["lag_offsets"]))
                console.print(typed)
        else:
            return _tier_now(client, args, console)
    return 0


def _seconds(value: str) -> float:
    from tierproxy.config.values import parse_duration_ms

    try:
        return parse_duration_ms(value) / 1000
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _tier_now(client: httpx.Client, args: argparse.Namespace, console: Console) -> int:
    """Ask for a pass; wait `--wait` for a tier job to take it (else withdraw it: one line, exit 1), then up to
    `--timeout` for the pass."""
    import sys

    r = client.post("/v1/tiering/run", params={"wait_ms": max(1000, int(args.wait * 1000))})
    if r.status_code >= 400:
        raise SystemExit(f"tier-now: HTTP {r.status_code}: {r.text}")
    run = r.json()
    path = f"/v1/tiering/runs/{run['run_id']}"
    with Progress(SpinnerColumn(), TextColumn("tiering run {task.fields[run]}: {task.fields[status]}"),
                  TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("run", run=run["run_id"], status=run["status"], total=None)
        for status, seconds in (("requested", args.wait), ("running", args.timeout)):
            deadline = time.monotonic() + seconds
            try:
                while run["status"] == status and time.monotonic() < deadline:
                    time.sleep(0.5)
                    run = _get(client, path)
                    bar.update(task, status=run["status"])
            except KeyboardInterrupt:  # its asker is gone: a request no job took yet goes with it
                if run["status"] == "requested":
                    client.delete(path)
                raise
            if run["status"] in ("requested", "expired"):  # no job took it in time: it must not run later
                withdrawn = client.delete(path)
                if withdrawn.status_code == 409:  # taken meanwhile: wait for the pass
                    run = _get(client, path)
                    continue
                if withdrawn.status_code >= 400:
                    raise SystemExit(f"tier-now: withdrawing run {run['run_id']}: HTTP {withdrawn.status_code}: "
                                     f"{withdrawn.text}")
                bar.stop()
                print(f"tierproxy: admin: no tier job took the request in {args.wait:g} s: is `tierproxy tier` "
                      "running against this metadata?", file=sys.stderr)
                return 1
    console.print(f"run {run['run_id']}: {run['status']}" + (f" — {run['summary']}" if run["summary"] else ""))
    return 0 if run["status"] == "succeeded" else 1
