"""The proxy process: listeners (bootstrap + port-per-broker), sessions, metadata refresh, graceful shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
import os
import signal
import socket
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, cast

from protocol.constants import ApiKey
from protocol.messages import MetadataResponse, MetadataResponseTopic
from tierproxy.config import ProxySettings
from tierproxy.config.identity.sasl import AuthenticationFailed
from tierproxy.kafka import tls
from tierproxy.kafka.asyncclient import AsyncWireClient
from tierproxy.proxy.brokers import BrokerMap
from tierproxy.proxy.flow import ByteBudget
from tierproxy.proxy.handlers import REQUEST_HANDLERS, RESPONSE_HANDLERS
from tierproxy.proxy.metrics import RemoteFetchStats
from tierproxy.proxy.session import ClientProtocol, RequestHandler, ResponseHandler, Session, UpstreamProtocol
from tierproxy.remote.service import RemoteTier

log = logging.getLogger("tierproxy.proxy.server")
METADATA_VERSION = 12
CLOSE_GRACE_S = 5.0  # after the drain: closing background work and the remote tier
REQUEST_FLOOR = 64 * 1024  # request bytes a connection holds without drawing on queued.max.request.bytes


class Proxy:
    """A running tierproxy: owns the listeners and every client session."""

    def __init__(self, settings: ProxySettings) -> None:
        self.settings = settings
        self.loop = asyncio.get_running_loop()
        self.brokers = BrokerMap(settings.advertised, settings.port_base, settings.broker_port_range,
                                 self._on_new_node)
        self.request_handlers: dict[int, RequestHandler] = dict(REQUEST_HANDLERS)
        self.response_handlers: dict[int, ResponseHandler] = dict(RESPONSE_HANDLERS)
        self.sessions: set[Session] = set()
        self.listeners: dict[int | None, asyncio.Server] = {}
        self.listener_ssl = tls.listener_context(settings)
        self.upstream_ssl = tls.upstream_context(settings)  # relayed client connections: never our certificate
        # our own connections: the identity's TLS; the relayed listener's only when they go to that listener too
        self._own_ssl = None if settings.own_listener_apart else self.upstream_ssl
        self.accepting_new = True
        self.stopped = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._bootstrap_rr = itertools.count()
        self._refresh_lock = asyncio.Lock()
        self._bound: set[int] = set()  # node ids whose proxy port is bound
        self.remote: RemoteTier | None = None
        self.fetch_stats = RemoteFetchStats()  # recorded by the intercepts, read by the admin API
        self.request_budget = ByteBudget(settings.queued_max_request_bytes, REQUEST_FLOOR)
        self.on_stop: list[Callable[[], None]] = []  # services started beside the proxy (the admin API)
        # one of several workers (serve --workers): every worker binds every port, the kernel spreads connections
        self.reuse_port = settings.worker_count > 1

    # --- startup -----------------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.settings.remote_log_storage_system_enable:
            self.remote = RemoteTier(self.settings)
            await self.remote.start()
        try:
            await self.refresh_metadata()
        except AuthenticationFailed as exc:  # tierproxy's own identity: the tier cannot work, the relay can
            log.error("tierproxy's own identity (command.config) was refused: %s; clients with their own "
                      "credentials are still relayed, nothing is served from the tier", exc)
        except (TimeoutError, OSError, ConnectionError) as exc:
            log.warning("no broker answered Metadata at start (%s); will retry when clients connect", exc)
        host, port = self.settings.listen_address
        sock = socket.create_server((host, port), reuse_port=self.reuse_port, backlog=1024)
        self.listeners[None] = await self.loop.create_server(
            lambda: ClientProtocol(self, None), sock=sock, ssl=self.listener_ssl)
        self.bootstrap_port = self.listeners[None].sockets[0].getsockname()[1]
        log.info("tierproxy listening on %s:%d (bootstrap) for brokers %s; broker ports from %d; event loop %s",
                 host, self.bootstrap_port, self.settings.bootstrap_servers, self.settings.port_base,
                 type(self.loop).__module__.split(".")[0])
        for node_id in list(self.brokers.upstream):
            self._on_new_node(node_id)
        if self.settings.connections_max_idle_ms > 0:
            self.spawn(self._idle_sweeper())

    def _on_new_node(self, node_id: int) -> None:
        """Bind the node's proxy port right away (the kernel queues connections) and serve it soon after."""
        port = self.brokers.port_for(node_id)
        if port is None or node_id in self._bound or not self.accepting_new:
            return
        host = self.settings.listen_address[0]
        try:
            sock = socket.create_server((host, port), reuse_port=self.reuse_port, backlog=1024)
        except OSError as exc:
            log.error("cannot listen on %s:%d for broker %d: %s", host, port, node_id, exc)
            return

        async def serve() -> None:
            self.listeners[node_id] = await self.loop.create_server(
                lambda: ClientProtocol(self, node_id), sock=sock, ssl=self.listener_ssl)

        self._bound.add(node_id)
        self.spawn(serve())

    async def refresh_metadata(self) -> None:
        """Learn the brokers from the first bootstrap server that answers (with tierproxy's own identity).

        When its own connections use another listener (`bootstrap.servers` in the command config), that listener's
        answer gives the node ids (their ports are bound) but not the addresses clients are relayed to: those
        come from the clients' own Metadata answers passing through."""
        async with self._refresh_lock:
            last: BaseException | None = None
            apart = self.settings.own_listener_apart
            for host, port in self.settings.own_bootstrap_list:
                client = AsyncWireClient(host, port, ssl_context=self._own_ssl, identity=self.settings.identity,
                                         timeout=self.settings.upstream_connect_timeout_ms / 1000)
                try:
                    md = await client.request(ApiKey.METADATA, METADATA_VERSION,
                                              {"topics": [], "allow_auto_topic_creation": False})
                    if apart:
                        for b in md["brokers"]:
                            self._on_new_node(b["node_id"])
                    else:
                        self.brokers.learn((b["node_id"], b["host"], b["port"]) for b in md["brokers"])
                    return
                except (TimeoutError, OSError, ConnectionError) as exc:
                    last = exc
                finally:
                    await client.close()
            if last is not None:
                raise last

    async def cluster_topics(self) -> dict[str, MetadataResponseTopic]:
        """Every topic's id and partitions (with leaders), from the first bootstrap server that answers."""
        last: BaseException = OSError("no bootstrap servers")
        for host, port in self.settings.own_bootstrap_list:
            client = AsyncWireClient(host, port, ssl_context=self._own_ssl, identity=self.settings.identity,
                                     timeout=self.settings.upstream_connect_timeout_ms / 1000)
            try:
                md = cast(MetadataResponse, await client.request(
                    ApiKey.METADATA, METADATA_VERSION, {"topics": None, "allow_auto_topic_creation": False}))
                if not self.settings.own_listener_apart:
                    self.brokers.learn((b["node_id"], b["host"], b["port"]) for b in md["brokers"])
                return {t["name"]: t for t in md["topics"] if t["error_code"] == 0 and t["name"] is not None}
            except (OSError, TimeoutError, ConnectionError) as exc:
                last = exc
            finally:
                await client.close()
        raise last

    # --- sessions ----------------------------------------------------------------------------------------------
    async def connect_upstream(self, session: Session) -> tuple[asyncio.Transport, str]:
        if session.node_id is None:
            servers = self.settings.bootstrap_list
            start = next(self._bootstrap_rr) % len(servers)
            candidates = servers[start:] + servers[:start]
        else:
            addr = self.brokers.upstream.get(session.node_id)
            if addr is None:
                await self.refresh_metadata()
                addr = self.brokers.upstream.get(session.node_id)
            if addr is None:
                raise LookupError(f"broker {session.node_id} is not in the cluster metadata")
            candidates = [addr]
        last: BaseException = OSError("no candidates")
        timeout = self.settings.upstream_connect_timeout_ms / 1000
        for host, port in candidates:
            try:
                transport, _ = await asyncio.wait_for(self.loop.create_connection(
                    lambda: UpstreamProtocol(session), host, port, ssl=self.upstream_ssl,
                    server_hostname=host if self.upstream_ssl else None), timeout)
                sock = transport.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return transport, f"{host}:{port}"
            except (TimeoutError, OSError) as exc:
                last = exc
        raise last

    def accepting(self, transport: asyncio.BaseTransport) -> bool:
        if not self.accepting_new:
            return False
        if len(self.sessions) >= self.settings.max_connections:
            log.warning("max.connections %d reached: refusing %s", self.settings.max_connections,
                        transport.get_extra_info("peername"))
            return False
        return True

    def session_opened(self, session: Session) -> None:
        self.sessions.add(session)

    def session_closed(self, session: Session) -> None:
        self.sessions.discard(session)
        self.request_budget.release(id(session))

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task failed", exc_info=task.exception())

    async def _idle_sweeper(self) -> None:
        idle = self.settings.connections_max_idle_ms / 1000
        while True:
            await asyncio.sleep(min(5.0, max(0.05, idle / 4)))
            now = self.loop.time()
            for s in list(self.sessions):
                if s.idle and now - s.last_active > idle:
                    log.info("closing client %s idle for %.0fs (connections.max.idle.ms)", s.peer, now - s.last_active)
                    s.close()

    # --- shutdown ----------------------------------------------------------------------------------------------
    async def stop(self) -> None:
        """Stop accepting, let in-flight requests finish (up to shutdown.drain.ms), then close everything."""
        if not self.accepting_new:
            return
        self.accepting_new = False
        log.info("stopping: no new connections; draining in-flight requests for up to %d ms",
                 self.settings.shutdown_drain_ms)
        for stop_service in self.on_stop:
            stop_service()
        for server in self.listeners.values():
            server.close()
        for s in list(self.sessions):
            s.client_gate.pause("draining")
        deadline = self.loop.time() + self.settings.shutdown_drain_ms / 1000
        while any(not s.idle for s in self.sessions) and self.loop.time() < deadline:
            await asyncio.sleep(0.02)
        busy = sum(1 for s in self.sessions if not s.idle)
        if busy:
            log.warning("shutdown: %d connections still had requests in flight", busy)
        for s in list(self.sessions):
            s.close()
        log.info("stopping: connections closed; closing the remote tier")
        # a dead broker must not hold the process: closing gets a few seconds, then we go anyway (asyncio.wait, not
        # wait_for: wait_for would wait for the cancellation of a library call that ignores it)
        others = [t for t in self._tasks if t is not asyncio.current_task()]  # not this stop itself
        closing = self.loop.create_task(self._close_rest(others))
        done, _ = await asyncio.wait({closing}, timeout=CLOSE_GRACE_S)
        if not done:
            log.warning("shutdown: closing background work and the remote tier took over %.0fs; stopping anyway",
                        CLOSE_GRACE_S)
        self.stopped.set()

    async def _close_rest(self, others: list[asyncio.Task[Any]]) -> None:
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        if self.remote is not None:
            await self.remote.close()


def _watchdog(seconds: float) -> None:
    """The last resort of a stop: whatever still holds the process (a library waiting on a dead broker, a task
    that swallows its cancellation), it exits `seconds` after SIGTERM, with a log line."""
    def expire() -> None:
        log.error("shutdown did not finish %.0fs after the signal; exiting now", seconds)
        logging.shutdown()
        os._exit(1)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()


async def serve(settings: ProxySettings, ready: asyncio.Event | None = None,
                services: Sequence[Callable[[Proxy], Awaitable[None]]] = ()) -> None:
    """Run until SIGTERM/SIGINT, then drain and stop. `services` start beside the proxy on its loop (the caller
    passes the admin API: this layer does not know it)."""
    proxy = Proxy(settings)
    await proxy.start()
    for start_service in services:
        await start_service(proxy)
    # long-lived startup objects leave the collector's view, and young-generation collections (each decoded
    # frame allocates a few dicts) run less often: fewer pauses on the Kafka path
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    loop = asyncio.get_running_loop()
    def on_signal() -> None:
        _watchdog(settings.shutdown_drain_ms / 1000 + CLOSE_GRACE_S + 5)
        proxy.spawn(proxy.stop())

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal)
    if ready is not None:
        ready.set()
    await proxy.stopped.wait()
    log.info("tierproxy stopped")
