"""Settings of `serve` and `tier` (sharing `CommonSettings`): defaults < config file < TIERPROXY_* env < CLI flags.

Keys use Kafka's dotted style in files (``bootstrap.servers=...``), ``TIERPROXY_BOOTSTRAP_SERVERS`` in the
environment and ``--bootstrap-server`` style flags on the command line. A bad value stops the process at
start with a `ConfigError` naming the key and the reason.
"""

from __future__ import annotations

import json
import os
import re
import socket
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from tierproxy.identity import ClientIdentity, load_command_config
from tierproxy.propfile import ConfigError as ConfigError  # where the settings' errors have always been imported from
from tierproxy.propfile import read_properties

ENV_PREFIX = "TIERPROXY_"
SPARK_MASTER = re.compile(r"local(\[(\*|[1-9]\d*)(,[1-9]\d*)?\])?|local-cluster\[\d+,\d+,\d+\]|"
                          r"spark://[^\s/]+(,[^\s/]+)*|k8s://\S+|yarn|mesos://\S+")
OVERRIDE_KEYS = {"retention.ms", "retention.bytes", "segment.bytes"}  # per topic in tier.topic.overrides
S = TypeVar("S", bound="CommonSettings")


def _hostport(value: str, key: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{key} must be HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def _has_uvloop() -> bool:
    import importlib.util

    return importlib.util.find_spec("uvloop") is not None


def file_uri(value: str) -> str:
    """`file:///abs`, `file://./rel`, `file:rel`, `file:/abs` or a plain path → `file:///absolute` (a relative path
    is relative to the working directory); anything else (s3://, topic:) unchanged."""
    v = value.strip()
    if v.startswith("file://./") or v.startswith("file://../"):
        path = v[len("file://"):]
    elif v.startswith("file:") and not v.startswith("file://"):
        path = v[len("file:"):]
    elif v.startswith("file://"):
        if not v.startswith("file:///"):
            raise ValueError(f"{v!r}: file://HOST/... names a host; use file:///absolute/path or file:relative/path")
        return v
    elif "://" not in v and not v.startswith("topic:") and v not in ("topic",):
        path = v
    else:
        return v
    if not path:
        raise ValueError("a file URI needs a path")
    return "file://" + str(Path(path).expanduser().absolute())


def check_writable_dir(path: Path) -> Path:
    """`path` (absolute, or relative to the working directory) is a directory tierproxy can write, or can be
    created: its nearest existing ancestor is a writable directory and not `/` (nothing is ever created at the
    filesystem root). Raises ValueError with the path and the reason."""
    p = path.expanduser().absolute()
    try:
        return _writable_dir(p)
    except PermissionError as exc:  # a parent this user cannot enter
        raise ValueError(f"{p}: cannot be reached by this user (uid {os.getuid()}): {exc.strerror}") from None


def _writable_dir(p: Path) -> Path:
    if p.exists():
        if not p.is_dir():
            raise ValueError(f"{p}: a file is in the way (not a directory)")
        if not os.access(p, os.W_OK | os.X_OK):
            raise ValueError(f"{p}: not writable by this user (uid {os.getuid()})")
        return p
    ancestor = p.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"{p}: {ancestor} is a file, not a directory")
    if ancestor == Path(ancestor.anchor):
        raise ValueError(f"{p}: its parent {p.parent} does not exist (nothing is created at {ancestor})")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"{p}: cannot be created, {ancestor} is not writable by this user (uid {os.getuid()})")
    return p


URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*):[^@\s/]*@")
SECRET_KEYS = ("password", "secret", "token", "credential")


def hide_url_passwords(text: str) -> str:
    """Every `scheme://user:password@` in `text` with its password as ***."""
    return URL_PASSWORD.sub(r"\g<head>:***@", text)


def _hidden(key: str, value: Any) -> Any:
    if value is None:
        return None
    if any(s in key for s in SECRET_KEYS):
        return "***"
    if isinstance(value, str):
        return hide_url_passwords(value)
    if isinstance(value, dict):
        return {k: _hidden(str(k), v) for k, v in value.items()}
    if isinstance(value, list):
        return [_hidden(key, v) for v in value]
    return value


class CommonSettings(BaseModel):
    """What `serve` and `tier` share: the cluster, the tier's storage and its metadata."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bootstrap_servers: str = Field(description="upstream brokers HOST:PORT[,HOST:PORT..]")
    storage: str = Field("file:tierproxy-data/tier", validate_default=True,
                         description="file:///path, a path (relative: to the working directory) or "
                         "s3://bucket/prefix?endpoint=")
    metadata: str | None = Field(None, description="topic:[NAME] (default: the metadata topic) or file:///dir")
    metadata_checkpoint_dir: Path | None = Field(None, description="local RLMM checkpoint (restart reads the tail)")
    # Kafka's RLM task retry keys: remote reads (serve) and copy retries after a leader change (tier)
    remote_log_manager_task_retry_backoff_ms: int = Field(500, ge=1)
    remote_log_manager_task_retry_backoff_max_ms: int = Field(30_000, ge=1)
    remote_log_manager_task_retry_jitter: float = Field(0.2, ge=0, le=1)
    command_config: Path | None = Field(None, description="Kafka client properties: tierproxy's own identity "
                                        "(security.protocol, sasl.*, ssl.*), as Kafka's --command-config")
    # the tier's own retention (Kafka's retention.* for the whole log; the broker topic's retention.* is the local
    # retention, Kafka's local.retention.*, and never deletes tier data): read by `tier`, shown by `serve`
    tier_retention_ms: int = Field(-1, ge=-1, description="delete tiered segments older than this (-1: never)")
    tier_retention_bytes: int = Field(-1, ge=-1, description="delete the oldest tiered segments beyond this many "
                                      "bytes per partition (-1: never)")
    tier_topic_overrides: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="JSON {topic: {retention.ms|retention.bytes|segment.bytes: N}}: the "
        "tier's retention and segment size for one topic")

    # the tier as an Iceberg table: written by `tier` / `iceberg`, its lag shown by `serve`
    iceberg_catalog: str | None = Field(None, description="the Iceberg step's catalog: `embedded` (SQLite next to "
                                        "the tier), sqlite:///path, a SQLAlchemy URL, or rest:https://host/path; "
                                        "set, `tier` runs the step after each pass and `serve` shows the table's lag")
    iceberg_catalog_credential: str | None = Field(None, repr=False, description="REST catalog OAuth2 "
                                                   "client_id:secret (secret)")
    iceberg_catalog_token: str | None = Field(None, repr=False, description="REST catalog bearer token (secret)")
    iceberg_table: str = Field("kafka.history", description="NAMESPACE.TABLE of the history table")

    @field_validator("tier_retention_ms", mode="before")
    @classmethod
    def _retention_ms(cls, v: Any) -> Any:
        return v if isinstance(v, int) or str(v).strip().lstrip("-").isdigit() else parse_duration_ms(v)

    @field_validator("tier_topic_overrides", mode="before")
    @classmethod
    def _overrides(cls, v: Any) -> Any:
        if isinstance(v, str):
            try:
                v = json.loads(v)
            except json.JSONDecodeError as exc:
                raise ValueError(f"not JSON: {exc}") from None
        if not isinstance(v, dict) or not all(isinstance(o, dict) for o in v.values()):
            raise ValueError('must be a JSON object {"topic": {"retention.ms": N, ...}}')
        for topic, over in v.items():
            unknown = set(over) - OVERRIDE_KEYS
            if unknown:
                raise ValueError(f"{topic}: unknown key(s) {sorted(unknown)} (known: {sorted(OVERRIDE_KEYS)})")
            for key, n in over.items():
                if not isinstance(n, int) or n < (1024 if key == "segment.bytes" else -1):
                    raise ValueError(f"{topic}: {key}={n!r} is not a whole number "
                                     f"{'>= 1024' if key == 'segment.bytes' else '>= -1'}")
        return v

    def tier_retention(self, topic: str) -> tuple[int, int]:
        """The tier's (retention.ms, retention.bytes) for `topic`: its override, else the global setting."""
        over = self.tier_topic_overrides.get(topic, {})
        return (int(over.get("retention.ms", self.tier_retention_ms)),
                int(over.get("retention.bytes", self.tier_retention_bytes)))

    @field_validator("command_config")
    @classmethod
    def _check_command_config(cls, v: Path | None) -> Path | None:
        if v is not None:
            load_command_config(v)  # fails at start, naming the key
        return v

    def redacted(self) -> dict[str, Any]:
        """The effective settings with secrets hidden (for logs and the admin API): secret keys as ***, and the
        password of any URL (a catalog's `postgresql://user:password@host/db`) as ***."""
        out = {k: _hidden(k, v) for k, v in self.model_dump(mode="json").items()}
        out["identity"] = self.identity.describe() if self.identity is not None else None  # never its secrets
        return out

    def __repr_args__(self) -> Any:  # repr() and str() hide what redacted() hides
        for key, value in super().__repr_args__():
            yield key, (_hidden(key, value) if key is not None and not isinstance(value, SecretStr) else value)

    @cached_property
    def identity(self) -> ClientIdentity | None:
        """tierproxy's own identity toward the brokers (None: PLAINTEXT, anonymous)."""
        return load_command_config(self.command_config) if self.command_config is not None else None

    @field_validator("bootstrap_servers")
    @classmethod
    def _check_bootstrap(cls, v: str) -> str:
        servers = [s.strip() for s in v.split(",") if s.strip()]
        if not servers:
            raise ValueError("needs at least one HOST:PORT")
        for s in servers:
            _hostport(s, "bootstrap.servers")
        return ",".join(servers)

    @field_validator("storage")
    @classmethod
    def _check_storage(cls, v: str) -> str:
        v = file_uri(v)
        if not (v.startswith("file:///") or v.startswith("s3://")):
            raise ValueError("must be file:///path, a path, or s3://bucket/prefix")
        if v.startswith("file://"):
            check_writable_dir(Path(v[len("file://"):]))
        return v

    @field_validator("metadata")
    @classmethod
    def _check_metadata(cls, v: str | None) -> str | None:
        if v is None or v.startswith("topic"):
            return v
        v = file_uri(v)
        if not v.startswith("file:///"):
            raise ValueError("must be topic:[NAME][?partitions=N&replication=R] or file:///dir (or a path)")
        check_writable_dir(Path(v[len("file://"):]))
        return v

    @field_validator("metadata_checkpoint_dir")
    @classmethod
    def _check_checkpoint(cls, v: Path | None) -> Path | None:
        return None if v is None else check_writable_dir(v)

    @property
    def bootstrap_list(self) -> list[tuple[str, int]]:
        return [_hostport(s, "bootstrap.servers") for s in self.bootstrap_servers.split(",")]

    @property
    def own_bootstrap(self) -> str:
        """Where tierproxy's own connections go: the command config's `bootstrap.servers` (a listener for its
        own identity, e.g. mTLS), else `bootstrap.servers`."""
        identity = self.identity
        return identity.bootstrap if identity is not None and identity.bootstrap else self.bootstrap_servers

    @property
    def own_listener_apart(self) -> bool:
        """tierproxy's own connections use another listener than the relayed client connections."""
        return self.own_bootstrap != self.bootstrap_servers

    @property
    def own_bootstrap_list(self) -> list[tuple[str, int]]:
        return [_hostport(s, "bootstrap.servers") for s in self.own_bootstrap.split(",")]


class ProxySettings(CommonSettings):
    """Everything `tierproxy serve` reads. Field names are the dotted keys with '.' → '_'."""
    listen: str = Field("127.0.0.1:9192", description="bootstrap listener HOST:PORT")
    advertised_host: str | None = Field(None, description="host clients use to reach the proxy")
    admin_listen: str | None = Field(None, description="admin HTTP listener HOST:PORT")
    admin_token: SecretStr | None = Field(None, description="bearer token for the admin API (all but health)")
    broker_port_base: int | None = Field(None, ge=1, le=65535,
                                         description="proxy port of broker node 0 (default listen port + 1)")
    broker_port_range: int = Field(100, ge=1, le=10000, description="how many node ids get a proxy port")
    socket_request_max_bytes: int = Field(100 * 1024 * 1024, ge=1024, description="max frame size")
    queued_max_request_bytes: int = Field(256 * 1024 * 1024, ge=1024 * 1024,
                                          description="bytes held by requests being received, all connections "
                                          "together (beyond 64 KiB each); reading pauses above it")
    sasl_server_max_receive_size: int = Field(524288, ge=1024, description="max request size while a client "
                                              "authenticates with SASL (after SaslHandshake, until done)")
    max_connections: int = Field(10000, ge=1, description="client connections accepted at once")
    connections_max_idle_ms: int = Field(600_000, ge=0, description="close client connections idle this long")
    shutdown_drain_ms: int = Field(10_000, ge=0, description="how long SIGTERM waits for in-flight requests")
    upstream_connect_timeout_ms: int = Field(10_000, ge=1)
    buffer_high_water_bytes: int = Field(4 * 1024 * 1024, ge=64 * 1024,
                                         description="pause the other side above this many buffered bytes")
    max_in_flight_requests: int = Field(1000, ge=1, description="per connection, before reading pauses")
    event_loop: str = Field(default_factory=lambda: "uvloop" if _has_uvloop() else "asyncio",
                            description="uvloop (libuv: lower added latency; the default where installed, as in the "
                            "image and tierproxy[uvloop]) or asyncio (the standard loop)")
    ssl_certfile: Path | None = Field(None, description="TLS certificate chain for the client listener")
    ssl_keyfile: Path | None = None
    ssl_cafile: Path | None = Field(None, description="CA that client certificates must chain to (mTLS)")
    upstream_ssl_enabled: bool = False
    upstream_ssl_cafile: Path | None = None
    upstream_ssl_certfile: Path | None = None
    upstream_ssl_keyfile: Path | None = None
    upstream_ssl_check_hostname: bool = True
    remote_log_storage_system_enable: bool = Field(True, description="serve offsets below the broker's log start "
                                                   "from the tier")
    remote_fetch_max_wait_ms: int = Field(500, ge=1, description="purgatory wait for remote partitions (KIP-1018)")
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

    @field_validator("event_loop")
    @classmethod
    def _check_loop(cls, v: str) -> str:
        if v not in ("asyncio", "uvloop"):
            raise ValueError("asyncio or uvloop")
        if v == "uvloop":
            try:
                import uvloop  # noqa: F401
            except ImportError:
                raise ValueError("uvloop is not installed (pip install 'tierproxy[uvloop]')") from None
        return v

    @field_validator("listen", "admin_listen")
    @classmethod
    def _check_listen(cls, v: str | None) -> str | None:
        if v is not None:
            _hostport(v, "listen")
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



def parse_duration_ms(value: str | int) -> int:
    """'30s', '5m', '1h', '250ms' or a number of milliseconds."""
    if isinstance(value, int):
        return value
    v = value.strip().lower()
    for suffix, factor in (("ms", 1), ("s", 1000), ("m", 60_000), ("h", 3_600_000)):
        if v.endswith(suffix) and v[: -len(suffix)].replace(".", "", 1).isdigit():
            return int(float(v[: -len(suffix)]) * factor)
    if v.isdigit():
        return int(v)
    raise ValueError(f"not a duration: {value!r} (use e.g. 30s, 5m, 250ms)")


class TierSettings(CommonSettings):
    """Everything `tierproxy tier` reads (shares the cluster, storage and metadata keys with `serve`)."""

    tier_topics: str = Field(r"^(?!__).*", description="regex of topics to tier (internal topics never)")
    tier_topics_exclude: str = Field(r".*-repartition$", description="regex of topics never tiered (default: "
                                     "Kafka Streams repartition topics, which Streams purges as it consumes)")
    tier_retention_max_delete_fraction: float = Field(
        0.5, gt=0, le=1, description="a pass refuses to delete more than this share of a partition's tiered bytes "
        "by retention (of a partition of three or more segments), or of the whole tier's bytes by topic deletions, "
        "at once, unless confirm.retention (--confirm-retention)")
    confirm_retention: bool = Field(False, description="apply tier retention even where it deletes more than "
                                    "tier.retention.max.delete.fraction at once (--confirm-retention)")
    tier_segment_bytes: int = Field(16 << 20, ge=1024, description="target size of a remote segment")
    tier_interval_ms: int = Field(30_000, ge=100, description="pause between tiering passes (--interval)")
    tier_orphan_timeout_ms: int = Field(600_000, ge=0,
                                        description="STARTED without FINISHED for this long = orphan")
    tier_task_max_attempts: int = Field(3, ge=1, description="copy attempts per segment (each with a new id)")
    tier_topic_delete_delay_ms: int = Field(
        600_000, ge=0, description="a tiered topic leaves the tier only once the cluster has answered UNKNOWN_TOPIC_ID "
        "for its id in passes at least this far apart (README 'What deletes history')")
    spark_master: str = Field("local[*]", description="Spark master (local[*] by default)")

    @field_validator("spark_master")
    @classmethod
    def _master(cls, v: str) -> str:
        if not SPARK_MASTER.fullmatch(v.strip()):
            raise ValueError(f"{v!r} is not a Spark master URL (local, local[N], local[*], local[N,F], "
                             "spark://HOST:PORT, k8s://https://HOST:PORT, yarn)")
        return v.strip()
    iceberg_topics: str | None = Field(None, description="regex of topics in the table (default: tier.topics)")
    iceberg_warehouse: str | None = Field(None, description="where data files go (default: iceberg/ under "
                                          "storage)")
    iceberg_isolation_level: str = Field("read_committed", pattern="^(read_committed|read_uncommitted)$",
                                         description="read_committed: aborted transactions never become rows")
    iceberg_retention: str = Field("follow", pattern="^(follow|keep)$",
                                   description="follow: rows leave the table when the tier deletes or purges them; "
                                   "keep: the table keeps them")
    iceberg_orphan_min_age_ms: int = Field(3_600_000, ge=0, description="data files no snapshot references are "
                                           "deleted once this old (a killed pass's)")
    tier_state_dir: Path = Field(Path("tierproxy-data/state"), validate_default=True,
                                 description="run summaries (gaps, last run)")

    @field_validator("tier_state_dir")
    @classmethod
    def _check_state_dir(cls, v: Path) -> Path:
        return check_writable_dir(v)

    @field_validator("tier_interval_ms", "tier_orphan_timeout_ms", "iceberg_orphan_min_age_ms",
                     "tier_topic_delete_delay_ms", mode="before")
    @classmethod
    def _durations(cls, v: Any) -> int:
        return parse_duration_ms(v)

    @field_validator("tier_topics", "tier_topics_exclude", "iceberg_topics")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            re.compile(v)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        return v


def dotted(field: str) -> str:
    return field.replace("_", ".")


def _normalize(key: str) -> str:
    return key.strip().lower().replace(".", "_").replace("-", "_")


def load_settings(model: type[S] = ProxySettings, *, config_file: str | Path | None = None,  # type: ignore[assignment]
                  cli: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> S:
    """Merge defaults < file < env < CLI and validate; raise `ConfigError` naming the bad key."""
    fields = model.model_fields
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if config_file is not None:
        path = Path(config_file)
        if not path.is_file():
            raise ConfigError(f"config: no such file {path}")
        for key, value in read_properties(path).items():
            name = _normalize(key)
            if name not in fields:
                raise ConfigError(f"{key}: unknown config key (in {path})")
            merged[name], sources[name] = value, f"{path}"
    environ = os.environ if env is None else env
    for key, value in environ.items():
        if key.startswith(ENV_PREFIX):
            name = _normalize(key[len(ENV_PREFIX):])
            if name in fields:
                merged[name], sources[name] = value, f"env {key}"
    for name, value in (cli or {}).items():
        if value is not None:
            merged[name], sources[name] = value, "command line"
    try:
        return model(**merged)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            key = dotted(loc) if loc else "config"
            src = f" (from {sources[loc]})" if loc in sources else ""
            problems.append(f"{key}: {err['msg'].removeprefix('Value error, ')}{src}")
        raise ConfigError("; ".join(problems)) from None
