"""The admin API: health, readiness, Prometheus metrics, per-partition tier status, tiering triggers, config.

Served by `tierproxy serve --admin-listen HOST:PORT` on the proxy's own event loop (uvicorn); handlers only read
in-memory state or make small control-plane requests, never blocking the Kafka path. With `admin.token` set,
every endpoint but /healthz and /readyz needs `Authorization: Bearer <token>` (compared in constant time); the
status page may use its login cookie instead (a value derived from the token, never the token), but a request
that changes anything (POST /v1/tiering/run) takes the bearer token only, so another page of the same site cannot
make a browser send it. Every request body is bounded (`MAX_BODY_BYTES`, 413 beyond): the admin port shares the
process, and its memory, with the Kafka path.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from prometheus_client import generate_latest
from pydantic import BaseModel

from tierproxy.admin import ui
from tierproxy.admin.metrics import REGISTRY, ProxyCollector
from tierproxy.tier.model import TierPass, uuid_str
from tierproxy.tier.rules import lost_range, tiering_lag

if TYPE_CHECKING:
    from tierproxy.proxy.server import Proxy

log = logging.getLogger("tierproxy.admin")
COOKIE = "tierproxy_admin_session"  # the status page's login: derived from admin.token (HttpOnly, SameSite=Strict)
MAX_BODY_BYTES = 64 << 10  # the largest request body read (a login form, an empty POST): 413 beyond


class PartitionStatus(BaseModel):
    partition: int
    leader: int
    broker_log_start: int | None
    high_watermark: int | None
    last_stable_offset: int | None
    tier_start: int | None
    purged_below: int  # the recorded log start (DeleteRecords through a proxy): nothing below it is served
    tier_end: int
    segments: int
    tier_bytes: int
    tiering_lag: int | None
    gap: list[int] | None
    holes: list[list[int]]  # [first missing, next start) between tiered segments (the next pass refills them)


class Segment(BaseModel):
    segment_id: str
    start_offset: int
    end_offset: int
    max_timestamp_ms: int
    size_bytes: int
    state: str
    leader_epochs: dict[str, int]


class TopicSummary(BaseModel):
    topic: str
    topic_id: str
    partitions: int
    tiered_segments: int
    tiered_bytes: int
    tier_retention_ms: int  # the tier's own retention for this topic (-1: keep forever)
    tier_retention_bytes: int


class IcebergPartition(BaseModel):
    topic: str
    partition: int
    tier_end: int  # the offset after the tier's last one
    table_end: int  # the table holds every committed record below it
    lag: int


class IcebergStatus(BaseModel):
    table: str
    catalog: str  # its URI, any password hidden
    exists: bool
    snapshot_id: int | None = None
    last_commit_ms: int | None = None
    files: int = 0
    rows: int = 0
    lag_offsets: int
    partitions: list[IcebergPartition]


class RemoteFetchStatus(BaseModel):
    enabled: bool
    ready: bool
    purgatory: int
    pool_running: int
    pool_queued: int
    pool_threads: int
    rejected: int
    expired: int
    cache_hit_ratio: float | None
    cache_bytes: int
    requests_total: int  # remote reads, bytes served and failed reads since start (all topics)
    bytes_total: int
    errors_total: int


class TieringRun(BaseModel):
    run_id: str
    status: str
    started_ms: int
    finished_ms: int | None
    summary: str | None
    returncode: int | None


class BoundedBodies:
    """ASGI middleware: a request body larger than `limit` is answered 413 without being read whole (a declared
    Content-Length at once; a chunked body once its bytes pass the limit), so no request holds more than `limit`
    bytes of the process's memory."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await self._too_large(send)
            return
        body, more = b"", True
        while more:  # at most `limit` + one chunk held
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                await self._too_large(send)
                return
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return dict(await receive())

        await self.app(scope, replay, send)

    async def _too_large(self, send: Any) -> None:
        payload = json.dumps({"error": f"request body over {self.limit} bytes"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": payload})


def create_app(proxy: Proxy) -> FastAPI:
    app = FastAPI(title="tierproxy admin", version="1", description=__doc__)
    REGISTRY.register(ProxyCollector(proxy)) if not getattr(proxy, "_collector", None) else None
    proxy._collector = True  # type: ignore[attr-defined]
    token = proxy.settings.admin_token

    session = session_value(token.get_secret_value()) if token is not None else ""

    def authorized(request: Request, cookie_ok: bool = True) -> bool:
        """The bearer token, or (for reads) the status page's login cookie."""
        if token is None:
            return True
        given = request.headers.get("authorization", "")
        if hmac.compare_digest(given.encode(), b"Bearer " + token.get_secret_value().encode()):
            return True
        return cookie_ok and hmac.compare_digest(request.cookies.get(COOKIE, "").encode(), session.encode())

    async def auth(request: Request) -> None:
        if not authorized(request):
            raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    async def bearer_only(request: Request) -> None:
        if not authorized(request, cookie_ok=False):
            raise HTTPException(401, "this request changes state: it needs the bearer token (a cookie is not "
                                "enough)", headers={"WWW-Authenticate": "Bearer"})

    guarded = [Depends(auth)]

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """The process is alive."""
        return {"status": "ok"}

    @app.get("/readyz", responses={503: {"description": "not ready"}})
    async def readyz() -> JSONResponse:
        """Upstream reachable and the remote log metadata caught up."""
        state = await readiness()
        return JSONResponse(state, status_code=200 if state["ready"] else 503)

    @app.get("/metrics", dependencies=guarded, response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:
        """Prometheus text format."""
        return PlainTextResponse(generate_latest(REGISTRY).decode(), media_type="text/plain; version=0.0.4")

    async def cluster() -> dict[str, Any]:
        try:
            return await asyncio.wait_for(proxy.cluster_topics(), 10)
        except Exception as exc:
            raise HTTPException(503, f"cluster metadata unavailable: {exc}") from None

    @app.get("/v1/topics", dependencies=guarded, response_model=list[TopicSummary])
    async def topics() -> list[TopicSummary]:
        return [_summary(proxy, name, t) for name, t in sorted((await cluster()).items())]

    async def topic_or_404(topic: str) -> dict[str, Any]:
        t: dict[str, Any] | None = (await cluster()).get(topic)
        if t is None:
            raise HTTPException(404, f"unknown topic {topic!r}")
        return t

    @app.get("/v1/topics/{topic}/partitions", dependencies=guarded, response_model=list[PartitionStatus])
    async def partitions(topic: str) -> list[PartitionStatus]:
        t = await topic_or_404(topic)
        out = []
        for p in sorted(t["partitions"], key=lambda x: x["partition_index"]):
            out.append(await _status(proxy, topic, t["topic_id"], p))
        return out

    @app.get("/v1/topics/{topic}/partitions/{partition}/segments", dependencies=guarded,
             response_model=list[Segment])
    async def segments(topic: str, partition: int) -> list[Segment]:
        t = await topic_or_404(topic)
        if not any(p["partition_index"] == partition for p in t["partitions"]):
            raise HTTPException(404, f"unknown partition {topic}-{partition}")
        pc = proxy.remote.partition_by_id(t["topic_id"], partition) if proxy.remote else None
        return [Segment(segment_id=uuid_str(m.segment_id.id), start_offset=m.start_offset, end_offset=m.end_offset,
                        max_timestamp_ms=m.max_timestamp_ms, size_bytes=m.segment_size_in_bytes, state=m.state.name,
                        leader_epochs={str(e): o for e, o in m.segment_leader_epochs.items()})
                for m in (pc.all_segments() if pc else [])]

    @app.get("/v1/iceberg", dependencies=guarded, response_model=IcebergStatus,
             responses={404: {"description": "iceberg.catalog is not set"}, 503: {"description": "catalog down"}})
    async def iceberg() -> IcebergStatus:
        """The tier as an Iceberg table: per partition the tier's end, the table's end and the lag between them."""
        if not proxy.settings.iceberg_catalog:
            raise HTTPException(404, "iceberg.catalog is not set: no Iceberg table to show")
        try:
            found = await iceberg_status(proxy)
        except Exception as exc:
            raise HTTPException(503, str(exc)) from None
        return IcebergStatus(**found)

    @app.get("/v1/remote-fetch", dependencies=guarded, response_model=RemoteFetchStatus)
    async def remote_fetch() -> RemoteFetchStatus:
        return _remote_status(proxy)

    async def readiness() -> dict[str, Any]:
        problems = []
        try:
            await asyncio.wait_for(proxy.refresh_metadata(), 5)
        except Exception as exc:
            problems.append(f"upstream: {exc}")
        if proxy.remote is not None and not proxy.remote.ready.is_set():
            problems.append("remote log metadata not caught up" + (f" ({proxy.remote.loading_problem})"
                                                                   if proxy.remote.loading_problem else ""))
        elif proxy.remote is not None and proxy.remote.rlmm.failure is not None:
            problems.append(f"remote log metadata consumer failed, restarting: {proxy.remote.rlmm.failure}")
        elif proxy.remote is not None and (lag := proxy.remote.rlmm.lag_records()) > \
                proxy.settings.metadata_max_lag_records:
            problems.append(f"remote log metadata {lag} records behind (metadata.max.lag.records="
                            f"{proxy.settings.metadata_max_lag_records})")
        return {"ready": not problems, "problems": problems}

    @app.get("/ui", response_class=HTMLResponse)
    async def status_page(request: Request) -> HTMLResponse:
        """The status page (HTML): every partition's offset line and remote fetch activity."""
        if not authorized(request):
            return HTMLResponse(ui.login_page(), status_code=401)
        sections = []
        for name, t in sorted((await cluster()).items()):
            parts = [await _status(proxy, name, t["topic_id"], p)
                     for p in sorted(t["partitions"], key=lambda x: x["partition_index"])]
            sections.append((_summary(proxy, name, t), parts))
        return HTMLResponse(ui.render(sections, _remote_status(proxy), await readiness()))

    @app.post("/ui/login", response_class=HTMLResponse)
    async def status_login(request: Request) -> Response:
        """The status page's token form: a correct token is kept in an HttpOnly, same-site cookie."""
        given = parse_qs((await request.body()).decode(errors="replace")).get("token", [""])[-1]
        if token is None or not hmac.compare_digest(given.encode(), token.get_secret_value().encode()):
            return HTMLResponse(ui.login_page("Wrong token."), status_code=401)
        out = RedirectResponse("/ui", status_code=303)
        out.set_cookie(COOKIE, session, httponly=True, samesite="strict", secure=request.url.scheme == "https")
        return out

    @app.post("/v1/tiering/run", dependencies=[Depends(bearer_only)], response_model=TieringRun, status_code=202,
              responses={409: {"description": "a pass is already asked for, or no tier is configured"}})
    async def tier_now() -> TieringRun:
        """Ask the running tier job (`tierproxy tier`) for a pass now, with its own configuration: recorded in the
        remote log metadata and picked up within a second by the job between passes. One at a time: while a
        request is pending, another is refused (409) with the pending run's id."""
        rlmm = proxy.remote.rlmm if proxy.remote is not None and proxy.remote.ready.is_set() else None
        if rlmm is None:
            raise HTTPException(409, "no remote log metadata here (storage not set, or still loading)")
        await rlmm.catch_up()
        pending = rlmm.cache.pass_pending()
        if pending is not None:
            raise HTTPException(409, f"a tiering pass is already asked for: run {pending.request_id}")
        asked = TierPass(uuid.uuid4().hex[:12], True, int(time.time() * 1000))
        await rlmm.put_tier_pass(asked)
        return _run_of(asked, None)

    @app.get("/v1/tiering/runs/{run_id}", dependencies=guarded, response_model=TieringRun)
    async def tier_run(run_id: str) -> TieringRun:
        """A requested pass: `requested` until the tier job has run it, then `succeeded` or `failed`."""
        cache = proxy.remote.rlmm.cache if proxy.remote is not None else None
        asked = cache.pass_requested if cache is not None else None
        if cache is None or asked is None or asked.request_id != run_id:
            raise HTTPException(404, f"unknown run {run_id!r} (only the latest is kept)")
        done = cache.pass_done
        return _run_of(asked, done if done is not None and done.request_id == run_id else None)

    @app.get("/v1/config", dependencies=guarded)
    async def config() -> dict[str, Any]:
        """The effective settings, secrets redacted."""
        data: dict[str, Any] = json.loads(json.dumps(proxy.settings.redacted(), default=str))
        return data

    return app


def session_value(token: str) -> str:
    """The status page's cookie: derived from the token (a stolen cookie does not give the bearer token)."""
    return hmac.new(token.encode(), b"tierproxy admin session v1", hashlib.sha256).hexdigest()


def _run_of(asked: TierPass, done: TierPass | None) -> TieringRun:
    if done is None:
        return TieringRun(run_id=asked.request_id, status="requested", started_ms=asked.event_timestamp_ms,
                          finished_ms=None, summary=None, returncode=None)
    return TieringRun(run_id=asked.request_id, status="succeeded" if done.returncode == 0 else "failed",
                      started_ms=asked.event_timestamp_ms, finished_ms=done.event_timestamp_ms, summary=done.summary,
                      returncode=done.returncode)


def _summary(proxy: Proxy, name: str, t: dict[str, Any]) -> TopicSummary:
    segs = nbytes = 0
    for p in t["partitions"]:
        pc = proxy.remote.partition_by_id(t["topic_id"], p["partition_index"]) if proxy.remote else None
        if pc is not None:
            finished = list(pc.finished())
            segs += len(finished)
            nbytes += sum(m.segment_size_in_bytes for m in finished)
    ms, max_bytes = proxy.settings.tier_retention(name)
    return TopicSummary(topic=name, topic_id=uuid_str(t["topic_id"]), partitions=len(t["partitions"]),
                        tiered_segments=segs, tiered_bytes=nbytes, tier_retention_ms=ms,
                        tier_retention_bytes=max_bytes)


def _remote_status(proxy: Proxy) -> RemoteFetchStatus:
    tier = proxy.remote
    if tier is None:
        return RemoteFetchStatus(enabled=False, ready=False, purgatory=0, pool_running=0, pool_queued=0,
                                 pool_threads=0, rejected=0, expired=0, cache_hit_ratio=None, cache_bytes=0,
                                 requests_total=0, bytes_total=0, errors_total=0)
    stats = proxy.fetch_stats
    lookups = tier.reader.hits + tier.reader.misses
    return RemoteFetchStatus(enabled=True, ready=tier.ready.is_set(), purgatory=stats.purgatory,
                             pool_running=tier.pool.running, pool_queued=tier.pool.queued,
                             pool_threads=tier.pool.threads, rejected=tier.pool.rejected, expired=stats.expired,
                             cache_hit_ratio=tier.reader.hits / lookups if lookups else None,
                             cache_bytes=int(tier.reader.chunks.currsize), requests_total=sum(stats.requests.values()),
                             bytes_total=sum(stats.bytes.values()), errors_total=sum(stats.errors.values()))


async def _status(proxy: Proxy, topic: str, topic_id: bytes, p: dict[str, Any]) -> PartitionStatus:
    n = p["partition_index"]
    pc = proxy.remote.partition_by_id(topic_id, n) if proxy.remote else None
    finished = list(pc.finished()) if pc else []
    tier_end = pc.latest_tiered_offset() if pc else -1
    offsets = None
    if proxy.remote is not None:
        try:
            offsets = await asyncio.wait_for(proxy.remote.broker_offsets(topic, n), 5)
        except Exception:
            offsets = None
    gap = None
    lag = None
    if offsets is not None:
        lag = tiering_lag(tier_end, offsets.log_start, offsets.last_stable)
        first_missing = max(tier_end + 1, pc.log_start_offset if pc else 0)  # below a purge: deleted on purpose
        lost = lost_range(first_missing, offsets.log_start, offsets.log_start) if tier_end >= 0 else None
        gap = list(lost) if lost is not None else None
    return PartitionStatus(partition=n, leader=p["leader_id"],
                           broker_log_start=offsets.log_start if offsets else None,
                           high_watermark=offsets.high_watermark if offsets else None,
                           last_stable_offset=offsets.last_stable if offsets else None,
                           tier_start=pc.earliest_offset() if pc else None,
                           purged_below=pc.log_start_offset if pc else 0, tier_end=tier_end,
                           segments=len(finished), tier_bytes=sum(m.segment_size_in_bytes for m in finished),
                           tiering_lag=lag, gap=gap, holes=[list(h) for h in pc.holes()] if pc else [])


async def iceberg_status(proxy: Proxy) -> dict[str, Any]:
    """The table's status from its catalog against the tier's metadata this replica holds."""
    from tierproxy.iceberg.status import serve_catalog, table_status

    s = proxy.settings
    cfg = serve_catalog(s.storage, s.iceberg_catalog, s.iceberg_catalog_credential, s.iceberg_catalog_token)
    ends: dict[tuple[str, int], tuple[str, int]] = {}
    if proxy.remote is not None:
        for pc in list(proxy.remote.rlmm.cache.partitions.values()):
            last = pc.latest_tiered_offset()
            if last >= 0:
                ends[(uuid_str(pc.tp.topic_id), pc.tp.partition)] = (pc.tp.topic, last + 1)
    found: dict[str, Any] = await asyncio.to_thread(table_status, cfg, s.iceberg_table, ends)
    return found


async def refresh_tier_status(proxy: Proxy, interval_s: float = 30.0) -> None:
    """Every `interval_s`, per tiered topic: offsets below the LSO not tiered yet (summed over its partitions) and
    how many partitions have a gap, for `tierproxy_tier_lag_offsets` and `tierproxy_tier_gaps` (and their alerts)."""
    while True:
        if proxy.remote is not None and not proxy.remote.ready.is_set():
            await asyncio.sleep(1.0)  # the figures need the tier's metadata: the first round as soon as it is loaded
            continue
        if proxy.remote is not None and proxy.remote.serving:
            try:
                topics = await asyncio.wait_for(proxy.cluster_topics(), 10)
                for name, t in topics.items():
                    tiered = [p for p in t["partitions"]
                              if proxy.remote.partition_by_id(t["topic_id"], p["partition_index"]) is not None]
                    if not tiered:
                        continue
                    states = [await _status(proxy, name, t["topic_id"], p) for p in tiered]
                    proxy.fetch_stats.lag[name] = sum(st.tiering_lag or 0 for st in states)
                    proxy.fetch_stats.gaps[name] = sum(1 for st in states if st.gap)
            except Exception as exc:  # the next round tries again
                log.debug("tier status refresh: %s", exc)
        if proxy.settings.iceberg_catalog:
            try:
                proxy.fetch_stats.iceberg = await iceberg_status(proxy)
            except Exception as exc:
                log.warning("iceberg table status: %s", exc)
        await asyncio.sleep(interval_s)


async def start_admin(proxy: Proxy) -> None:
    """The admin HTTP API on `admin.listen`, on the proxy's event loop; it stops when the proxy does."""
    if not proxy.settings.admin_listen:
        return
    import uvicorn

    host, _, port = proxy.settings.admin_listen.rpartition(":")
    config = uvicorn.Config(BoundedBodies(create_app(proxy), MAX_BODY_BYTES), host=host or "0.0.0.0", port=int(port),
                            log_level="warning",
                            lifespan="off", access_log=False)
    server = uvicorn.Server(config)
    # uvicorn captures SIGTERM/SIGINT while it serves and raises them again once it exits, so the proxy's own
    # handler (drain, then stop) still runs
    proxy.on_stop.append(lambda: setattr(server, "should_exit", True))
    proxy.spawn(server.serve())
    proxy.spawn(refresh_tier_status(proxy))
    log.info("admin API on http://%s:%s", host, port)
