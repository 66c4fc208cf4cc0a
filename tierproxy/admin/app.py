"""The admin API: health, readiness, Prometheus metrics, per-partition tier status, tiering triggers, config.

Served by `tierproxy serve --admin-listen HOST:PORT` on the proxy's own event loop (uvicorn); handlers only read
in-memory state or make small control-plane requests, never blocking the Kafka path. With `admin.token` set,
every endpoint but /healthz and /readyz needs `Authorization: Bearer <token>` (compared in constant time); the
status page may use its login cookie instead (a value derived from the token, never the token), but a request
that changes anything (POST /v1/tiering/run, DELETE /v1/tiering/runs/{id}) takes the bearer token only, so another
page of the same site cannot make a browser send it. Every request body is bounded (`MAX_BODY_BYTES`, 413
beyond): the admin port shares the process, and its memory, with the Kafka path.

Modules: `app` (the routes), `models` (response models), `guard` (bodies, cookie), `status` (what is reported),
`runs` (tiering passes asked for), `metrics` (the Prometheus collector), `ui` (the status page).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from typing import Any
from urllib.parse import parse_qs

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from prometheus_client import generate_latest

from protocol.messages import MetadataResponseTopic
from tierproxy.admin import ui
from tierproxy.admin.guard import COOKIE, MAX_BODY_BYTES, BoundedBodies, session_value
from tierproxy.admin.metrics import REGISTRY, ProxyCollector
from tierproxy.admin.models import (
    IcebergStatus,
    PartitionStatus,
    RemoteFetchStatus,
    Segment,
    TieringRun,
    TopicSummary,
)
from tierproxy.admin.pool import PoolRegistry
from tierproxy.admin.runs import DEFAULT_WAIT_MS, request_pass, run_status, withdraw_pass
from tierproxy.admin.status import iceberg_status, refresh_tier_status, remote_status, topic_status, topic_summary
from tierproxy.config.distribution import pip_install
from tierproxy.proxy.server import Proxy
from tierproxy.tier.model import uuid_str
from tierproxy.tier.rules import never_tiered

log = logging.getLogger("tierproxy.admin")


def create_app(proxy: Proxy, pool: PoolRegistry | None = None) -> FastAPI:
    """The admin API of `proxy`; with `pool` (serve --workers N), /metrics is the whole pool's."""
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
        await applied()
        return PlainTextResponse(generate_latest(pool or REGISTRY).decode(), media_type="text/plain; version=0.0.4")

    async def applied() -> None:
        """The tier's deferred metadata records applied, a partition per turn of the loop, before what sums them all
        (`tier.cache`: the first scrape after a start applies a million segments' records)."""
        if proxy.remote is not None:
            await proxy.remote.rlmm.cache.index_gradually()

    async def cluster() -> dict[str, MetadataResponseTopic]:
        try:
            return await asyncio.wait_for(proxy.cluster_topics(), 10)
        except Exception as exc:
            raise HTTPException(503, f"cluster metadata unavailable: {exc}") from None

    @app.get("/v1/topics", dependencies=guarded, response_model=list[TopicSummary])
    async def topics(internal: bool = False) -> list[TopicSummary]:
        """The cluster's topics and what the tier holds of each; internal topics (never tiered: the broker's own,
        tierproxy's metadata topic) only with `?internal=true`, as Kafka's tools list them only when asked."""
        await applied()
        return [topic_summary(proxy, name, t) for name, t in sorted((await cluster()).items())
                if internal or not never_tiered(name, t["is_internal"])]

    async def topic_or_404(topic: str) -> MetadataResponseTopic:
        t = (await cluster()).get(topic)
        if t is None:
            raise HTTPException(404, f"unknown topic {topic!r}")
        return t

    @app.get("/v1/topics/{topic}/partitions", dependencies=guarded, response_model=list[PartitionStatus])
    async def partitions(topic: str) -> list[PartitionStatus]:
        t = await topic_or_404(topic)
        return await topic_status(proxy, topic, t["topic_id"], sorted(t["partitions"],
                                                                        key=lambda x: x["partition_index"]))

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
        except ModuleNotFoundError as exc:  # a proxy installed without the iceberg extra
            raise HTTPException(503, f"the Iceberg table's status needs the iceberg extra ({exc.name} is not "
                                f"installed): {pip_install('iceberg')}") from None
        except Exception as exc:
            raise HTTPException(503, str(exc)) from None
        proxy.fetch_stats.iceberg = found  # the metrics show what this answer showed, not an older refresh
        return IcebergStatus(**found)

    @app.get("/v1/remote-fetch", dependencies=guarded, response_model=RemoteFetchStatus)
    async def remote_fetch() -> RemoteFetchStatus:
        return remote_status(proxy)

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
        await applied()
        sections = []
        for name, t in sorted((await cluster()).items()):
            if never_tiered(name, t["is_internal"]):  # as /v1/topics: internal topics are not the tier's
                continue
            parts = await topic_status(proxy, name, t["topic_id"],
                                       sorted(t["partitions"], key=lambda x: x["partition_index"]))
            sections.append((topic_summary(proxy, name, t), parts))
        return HTMLResponse(ui.render(sections, remote_status(proxy), await readiness()))

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
    async def tier_now(wait_ms: int = Query(DEFAULT_WAIT_MS, ge=1000, le=86_400_000)) -> TieringRun:
        """Ask the running tier job (`tierproxy tier`) for a pass now, with its own configuration: recorded in the
        remote log metadata and picked up within a second by the job between passes. One at a time: while a
        request is still to be taken, another is refused (409) with its run's id. A request no job takes within
        `wait_ms` expires (status `expired`): it blocks nothing after that."""
        return await request_pass(proxy, wait_ms)

    @app.get("/v1/tiering/runs/{run_id}", dependencies=guarded, response_model=TieringRun)
    async def tier_run(run_id: str) -> TieringRun:
        """A requested pass: `requested` until a tier job takes it (`expired` if none did in time, `withdrawn`),
        `running`, then `succeeded` or `failed`."""
        return run_status(proxy, run_id)

    @app.delete("/v1/tiering/runs/{run_id}", dependencies=[Depends(bearer_only)], response_model=TieringRun,
                responses={409: {"description": "a tier job took it already"}})
    async def tier_run_withdraw(run_id: str) -> TieringRun:
        """Withdraw a requested pass that no tier job has taken (`tierproxy admin tier-now` does when it stops
        waiting): status `withdrawn`, and a later request is taken at once."""
        return await withdraw_pass(proxy, run_id)

    @app.get("/v1/config", dependencies=guarded)
    async def config() -> dict[str, Any]:
        """The effective settings, secrets redacted."""
        data: dict[str, Any] = json.loads(json.dumps(proxy.settings.redacted(), default=str))
        return data

    return app


async def start_admin(proxy: Proxy, pool: PoolRegistry | None = None) -> None:
    """The admin HTTP API on `admin.listen` (`serve` starts it only when that is set), on the proxy's event loop; it
    stops when the proxy does. `pool`: the first of `serve --workers N`, whose /metrics is the pool's."""
    assert proxy.settings.admin_listen is not None
    import uvicorn

    host, _, port = proxy.settings.admin_listen.rpartition(":")
    config = uvicorn.Config(BoundedBodies(create_app(proxy, pool), MAX_BODY_BYTES), host=host or "0.0.0.0",
                            port=int(port),
                            log_level="warning",
                            lifespan="off", access_log=False)
    server = uvicorn.Server(config)
    # uvicorn captures SIGTERM/SIGINT while it serves and raises them again once it exits, so the proxy's own
    # handler (drain, then stop) still runs
    proxy.on_stop.append(lambda: setattr(server, "should_exit", True))
    proxy.spawn(server.serve())
    proxy.spawn(refresh_tier_status(proxy))
    log.info("admin API on http://%s:%s", host, port)
