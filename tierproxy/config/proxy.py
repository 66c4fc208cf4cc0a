"""`ProxySettings`: everything `tierproxy serve` reads."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator

from tierproxy.config.common import CommonSettings
from tierproxy.config.distribution import pip_install
from tierproxy.config.values import _has_uvloop, _hostport

MAX_WORKERS = 256
# per-process bounds whose configured value is the whole pool's: a worker gets 1/N of each (`for_worker`)
DIVIDED = ("queued_max_request_bytes", "remote_fetch_cache_bytes", "remote_log_index_file_cache_total_size_bytes",
           "max_connections", "remote_log_manager_fetch_max_bytes_per_second")


class ProxySettings(CommonSettings):
    """Everything `tierproxy serve` reads. Field names are the dotted keys with '.' → '_'."""
    listen: str = Field("127.0.0.1:9192", description="bootstrap listener HOST:PORT")
    advertised_host: str | None = Field(None, description="host clients use to reach the proxy")
    admin_listen: str | None = Field(None, description="admin HTTP listener HOST:PORT (neither listen's port nor one "
                                        "of the broker port range)")
    admin_token: SecretStr | None = Field(None, description="bearer token for the admin API (all but health)")
    broker_port_base: int | None = Field(None, ge=1, le=65535,
                                         description="proxy port of broker node 0 (default listen port + 1)")
    broker_port_range: int = Field(100, ge=1, le=10000, description="how many node ids get a proxy port")
    socket_request_max_bytes: int = Field(100 * 1024 * 1024, ge=1024, description="max frame size")
    queued_max_request_bytes: int = Field(256 * 1024 * 1024, ge=1024 * 1024,
                                          description="bytes held by requests being received, all connections "
                                          "together (beyond 64 KiB each), reserved before a buffer grows; "
                                          "reading pauses above it (one growth and the oldest request may pass "
                                          "it; Kafka: one request)")
    sasl_server_max_receive_size: int = Field(524288, ge=1024, description="max request size while a client "
                                              "authenticates with SASL (after SaslHandshake, until done)")
    max_connections: int = Field(10000, ge=1, description="client connections accepted at once")
    connections_max_idle_ms: int = Field(600_000, ge=0, description="close client connections idle this long")
    shutdown_drain_ms: int = Field(10_000, ge=0, description="how long SIGTERM waits for in-flight requests")
    upstream_connect_timeout_ms: int = Field(10_000, ge=1, description="how long a connection to a broker may take")
    buffer_high_water_bytes: int = Field(4 * 1024 * 1024, ge=64 * 1024,
                                         description="pause the other side above this many buffered bytes")
    max_in_flight_requests: int = Field(1000, ge=1, description="per connection, before reading pauses")
    workers: str = Field("1", description="processes serving the same ports (SO_REUSEPORT), restarted when one "
                         "dies; the memory bounds, max.connections and the remote fetch quota are divided between "
                         "them (the totals hold for the whole); auto: one per core the process may use")
    event_loop: str = Field(default_factory=lambda: "uvloop" if _has_uvloop() else "asyncio",
                            description="uvloop (libuv: lower added latency; the default where installed, as in the "
                            "image and kafka-tierproxy[uvloop]) or asyncio (the standard loop)")
    ssl_certfile: Path | None = Field(None, description="TLS certificate chain for the client listener")
    ssl_keyfile: Path | None = Field(None, description="private key of ssl.certfile (PEM)")
    ssl_cafile: Path | None = Field(None, description="CA that client certificates must chain to (mTLS)")
    upstream_ssl_enabled: bool = Field(False, description="TLS toward the brokers")
    upstream_ssl_cafile: Path | None = Field(None, description="CA the brokers' certificates chain to (default: "
                                             "the system's)")
    upstream_ssl_certfile: Path | None = Field(None, description="tierproxy's client certificate toward the brokers "
                                               "(mTLS; relayed client connections never carry it)")
    upstream_ssl_keyfile: Path | None = Field(None, description="private key of upstream.ssl.certfile (PEM)")
    upstream_ssl_check_hostname: bool = Field(True, description="check the brokers' certificates name their "
                                              "hosts")
    remote_log_storage_system_enable: bool = Field(True, description="serve offsets below the broker's log start "
                                                   "from the tier")
    remote_fetch_max_wait_ms: int = Field(500, ge=1, description="purgatory wait for remote partitions (KIP-1018)")
    remote_authorization_cache_ms: int = Field(
        0, ge=0, le=60_000, description="a connection whose fetch of a topic the broker authorized less than this "
        "long ago reads on from the tier without asking the broker again (0: every fetch is asked; a revoked ACL "
        "stops tier reads within this window)")
    remote_log_manager_fetch_max_bytes_per_second: int = Field(
        -1, ge=-1, description="bytes served from the tier per second, whole process (KIP-956; -1: no limit)")
    remote_fetch_client_max_bytes_per_second: int = Field(
        -1, ge=-1, description="bytes served from the tier per second to one client id (-1: no limit)")
    remote_list_offsets_request_timeout_ms: int = Field(30_000, ge=1, description="timestamp lookups in the tier "
                                                        "(KIP-1075; a request's own timeout_ms, v10+, is shorter)")
    remote_log_reader_threads: int = Field(10, ge=1, description="concurrent remote reads")
    remote_log_reader_max_pending_tasks: int = Field(100, ge=0, description="queued remote reads before rejecting")
    remote_fetch_chunk_bytes: int = Field(8 << 20, ge=64 * 1024, description="read-ahead chunk size (one S3 GET)")
    remote_fetch_cache_bytes: int = Field(256 << 20, ge=0, description="chunk cache size")
    remote_fetch_file_direct_reads: bool = Field(True, description="a file:// tier is read in exact ranges "
                                                 "through the OS page cache, without the chunk cache and read-ahead "
                                                 "(false: as S3 is, e.g. for a network filesystem)")
    remote_fetch_file_sendfile: bool = Field(True, description="a file tier's records go from the segment file to "
                                             "a plaintext client's socket with sendfile, as the broker sends its "
                                             "log: not read by the proxy, so their CRCs are the client's to check "
                                             "(false: read, and every batch's CRC checked on every serve, as from "
                                             "S3)")
    remote_fetch_prefetch_chunks: int = Field(2, ge=0, description="chunks read ahead for sequential readers")
    remote_fetch_prefetch_max_chunks: int = Field(8, ge=0, description="how deep the read-ahead may grow while "
                                                  "storage is slower than a sequential reader")
    metadata_max_lag_records: int = Field(1000, ge=0, description="readyz fails while this replica's view of the "
                                          "remote log metadata is further behind than this many records")
    remote_log_index_file_cache_total_size_bytes: int = Field(64 << 20, ge=0, description="index cache size")

    @field_validator("remote_log_manager_fetch_max_bytes_per_second", "remote_fetch_client_max_bytes_per_second")
    @classmethod
    def _rate(cls, v: int) -> int:
        if v == 0:
            raise ValueError("0 would serve nothing from the tier: use -1 for no limit, or a positive rate")
        return v

    @field_validator("workers")
    @classmethod
    def _check_workers(cls, v: str) -> str:
        v = v.strip()
        if v != "auto" and not (v.isdigit() and 1 <= int(v) <= MAX_WORKERS):
            raise ValueError(f"{v!r}: a number of processes from 1 to {MAX_WORKERS}, or auto")
        return v

    @field_validator("event_loop")
    @classmethod
    def _check_loop(cls, v: str) -> str:
        if v not in ("asyncio", "uvloop"):
            raise ValueError("asyncio or uvloop")
        if v == "uvloop":
            try:
                import uvloop  # noqa: F401
            except ImportError:
                raise ValueError(f"uvloop is not installed ({pip_install('uvloop')})") from None
        return v

    @field_validator("listen", "admin_listen")
    @classmethod
    def _check_listen(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None:
            _hostport(v, "admin.listen" if info.field_name == "admin_listen" else "listen")
        return v

    @model_validator(mode="after")
    def _check_tls(self) -> ProxySettings:
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("ssl.certfile and ssl.keyfile go together")
        for name in ("ssl_certfile", "ssl_keyfile", "ssl_cafile", "upstream_ssl_cafile", "upstream_ssl_certfile",
                     "upstream_ssl_keyfile"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise ValueError(f"{name.replace('_', '.')}: no such file {path}")
        port = self.listen_address[1]
        base = self.port_base
        if port != 0 and base <= port < base + self.broker_port_range:
            raise ValueError(f"listen port {port} falls inside the broker port range {base}..")
        if self.admin_listen is not None and (admin := _hostport(self.admin_listen, "admin.listen")[1]) != 0:
            if admin == port:
                raise ValueError(f"admin.listen {self.admin_listen}: the same port as listen {self.listen}")
            if base <= admin < base + self.broker_port_range:
                raise ValueError(f"admin.listen {self.admin_listen}: inside the broker port range {base}.."
                                 f"{base + self.broker_port_range - 1} (broker.port.base + node id, for "
                                 f"broker.port.range={self.broker_port_range} node ids): pick a port outside it")
        return self

    @property
    def listen_address(self) -> tuple[str, int]:
        return _hostport(self.listen, "listen")

    @property
    def port_base(self) -> int:
        return self.broker_port_base if self.broker_port_base is not None else self.listen_address[1] + 1

    @property
    def advertised(self) -> str:
        if self.advertised_host:
            return self.advertised_host
        host = self.listen_address[0]
        return socket.getfqdn() if host in ("0.0.0.0", "::", "") else host

    @property
    def worker_count(self) -> int:
        """How many processes serve (`workers`; auto: the cores this process may run on)."""
        if self.workers != "auto":
            return int(self.workers)
        affinity = getattr(os, "sched_getaffinity", None)  # Linux; elsewhere every core
        return len(affinity(0)) if affinity is not None else os.cpu_count() or 1

    def for_worker(self, index: int, count: int) -> ProxySettings:
        """Worker `index` of `count`'s settings: 1/count of each bound in DIVIDED (so the configured totals hold
        for the pool), and the admin API in worker 0 only."""
        if count == 1:
            return self
        update: dict[str, object] = {"workers": str(count)}
        for name in DIVIDED:
            total = getattr(self, name)
            update[name] = total if total <= 0 else max(1, total // count)  # -1: no limit, 0: none
        if index != 0:
            update["admin_listen"] = None
        return self.model_copy(update=update)
