"""`CommonSettings`: what `serve` and `tier` share (the cluster, the tier's storage and metadata, the tier's
retention, tierproxy's own identity)."""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from tierproxy.config.identity import ClientIdentity, load_command_config
from tierproxy.config.values import (
    _hidden,
    _hostport,
    check_writable_dir,
    file_uri,
    hide_url_passwords,
    location,
    parse_duration_ms,
    typed_table_rules,
)

OVERRIDE_KEYS = {"retention.ms", "retention.bytes", "segment.bytes"}  # per topic in tier.topic.overrides


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
    remote_log_manager_task_retry_backoff_ms: int = Field(500, ge=1, description="first pause before a failed tier "
                                                          "read or copy is tried again (KIP-405's name; doubles)")
    remote_log_manager_task_retry_backoff_max_ms: int = Field(30_000, ge=1, description="the longest pause between "
                                                              "retries of a tier read or copy")
    remote_log_manager_task_retry_jitter: float = Field(0.2, ge=0, le=1, description="random share (0..1) added "
                                                        "to or taken from each retry pause")
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
    iceberg_tables: str | None = Field(
        None, description="typed tables: `REGEX=NAMESPACE.PATTERN` entries separated by `;`, each topic the regex "
        "matches in full gets a table of its values decoded with the schema registry, named by the pattern "
        "(`{topic}` in it: the topic with characters other than letters, digits and _ as _), e.g. "
        "`orders|payments=kafka.{topic}`")

    @field_validator("iceberg_tables")
    @classmethod
    def _tables(cls, v: str | None) -> str | None:
        if v is not None:
            typed_table_rules(v)
        return v

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
        v = file_uri(location(v))
        if not (v.startswith("file:///") or v.startswith("s3://")):
            raise ValueError(f"{hide_url_passwords(v)!r} is not file:///path, a path, or s3://bucket/prefix")
        if v.startswith("file://"):
            check_writable_dir(Path(v[len("file://"):]))
        return v

    @field_validator("metadata")
    @classmethod
    def _check_metadata(cls, v: str | None) -> str | None:
        if v is None:
            return v
        v = location(v)
        if v.startswith("topic"):
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

