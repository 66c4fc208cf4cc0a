"""A Schema Registry client for the typed tables: Confluent's REST API (`/schemas/ids/{id}`, `/subjects/{s}/versions`),
as Confluent Schema Registry, Apicurio's `/apis/ccompat/v7`, Karapace and Redpanda serve it.

Schemas are immutable per id, so each is fetched once per process (the driver and each executor keep their own).
A registry that cannot be reached or answers 5xx is `RegistryUnavailable` (the pass fails, nothing is committed);
an id or subject it does not know is `SchemaNotFound` (a record's problem: it goes to the dead-letter table).
"""

from __future__ import annotations

import base64
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from tierproxy.config import hide_url_password, redact

ATTEMPTS = 3
BACKOFF_S = 0.5


class RegistryUnavailable(RuntimeError):
    """The registry cannot be reached, refuses our credentials, or fails (5xx): the message names its URL."""


class SchemaNotFound(LookupError):
    """The registry answers that it does not know this schema id or subject."""


@dataclass(frozen=True)
class RegistryConfig:
    url: str  # base URL of the Confluent-compatible API
    basic_auth: str | None = None  # "user:password" (iceberg.schema.registry.basic.auth.user.info; never logged)
    ca_location: str | None = None  # PEM bundle verifying an https registry (default: the system's)
    timeout_s: float = 30.0

    def __repr__(self) -> str:  # the password stays out of logs and tracebacks
        return f"RegistryConfig(url={hide_url_password(self.url)!r})"

    def redact(self, text: str) -> str:
        """`text` (an HTTP client's error, a registry's answer) without the registry's URL password or basic auth."""
        from tierproxy.config.values import url_password

        secret = self.basic_auth.partition(":")[2] if self.basic_auth else None
        return redact(text, url_password(self.url), secret, self.basic_auth)


@dataclass(frozen=True)
class RegisteredSchema:
    id: int
    schema_type: str  # AVRO, PROTOBUF, JSON
    text: str  # the schema as registered
    version: int | None = None  # its version under the subject it was looked up by, when it was


class RegistryClient:
    """Blocking (the driver plans, executors decode in Spark tasks); one HTTP connection pool per client."""

    def __init__(self, config: RegistryConfig) -> None:
        import httpx

        auth = tuple(config.basic_auth.split(":", 1)) if config.basic_auth else None
        self.config = config
        self._http = httpx.Client(base_url=config.url.rstrip("/"), auth=auth,  # type: ignore[arg-type]
                                  verify=config.ca_location or True, timeout=config.timeout_s,
                                  headers={"Accept": "application/vnd.schemaregistry.v1+json, application/json"})
        self._by_id: dict[int, RegisteredSchema] = {}

    def close(self) -> None:
        self._http.close()

    def schema(self, schema_id: int) -> RegisteredSchema:
        """The schema registered under `schema_id` (cached: an id's schema never changes)."""
        found = self._by_id.get(schema_id)
        if found is None:
            path = f"/schemas/ids/{schema_id}"
            body = self._get(path, f"schema id {schema_id}")
            found = self._by_id[schema_id] = RegisteredSchema(schema_id, body.get("schemaType") or "AVRO",
                                                              self._text(body, path))
        return found

    def versions(self, subject: str) -> list[RegisteredSchema]:
        """Every version of `subject`, oldest first ([] when the subject does not exist)."""
        try:
            numbers = self._get(f"/subjects/{quote(subject, safe='')}/versions", f"subject {subject}")
        except SchemaNotFound:
            return []
        out = []
        for v in sorted(int(n) for n in numbers):
            path = f"/subjects/{quote(subject, safe='')}/versions/{v}"
            body = self._get(path, f"subject {subject} version {v}")
            s = RegisteredSchema(int(body["id"]), body.get("schemaType") or "AVRO", self._text(body, path), v)
            self._by_id.setdefault(s.id, RegisteredSchema(s.id, s.schema_type, s.text))
            out.append(s)
        return out

    def _text(self, body: dict[str, Any], path: str) -> str:
        """The schema's text as the decoders take it: as registered, but for Protobuf the base64 of a
        FileDescriptorSet holding the schema's file last and the files it references (by the names it imports
        them by) before it, so the text alone decodes its records."""
        if (body.get("schemaType") or "AVRO").upper() != "PROTOBUF":
            return str(body["schema"])
        from google.protobuf import descriptor_pb2

        files: dict[str, Any] = {}
        if not self._add_proto(body, path, "schema.proto", files, 0):
            return str(body["schema"])  # not decodable: its records become dead letters saying so
        return base64.b64encode(descriptor_pb2.FileDescriptorSet(file=list(files.values())).SerializeToString()
                                ).decode("ascii")

    def _add_proto(self, body: dict[str, Any], path: str, name: str, files: dict[str, Any], depth: int) -> bool:
        """Adds a Protobuf schema's references (depth first), then its own file, to `files`; False when one of
        them has no serialized form or they nest deeper than 32."""
        from google.protobuf import descriptor_pb2
        from google.protobuf.message import DecodeError

        if depth > 32:
            return False
        for ref in body.get("references") or []:
            if ref["name"] not in files:
                ref_path = f"/subjects/{quote(ref['subject'], safe='')}/versions/{ref['version']}"
                if not self._add_proto(self._get(ref_path, f"reference {ref['name']}"), ref_path, ref["name"],
                                       files, depth + 1):
                    return False
        proto = descriptor_pb2.FileDescriptorProto()
        try:  # Apicurio keeps the serialized form a Confluent serializer registers; Confluent's registry gives the
            # .proto text unless asked for `format=serialized`
            proto.ParseFromString(base64.b64decode(str(body["schema"]).encode("ascii"), validate=True))
        except (ValueError, DecodeError):
            serialized = self._get(f"{path}?format=serialized", f"{path} (serialized)")
            try:
                proto.ParseFromString(base64.b64decode(str(serialized["schema"]).encode("ascii"), validate=True))
            except (ValueError, DecodeError):
                return False
        if depth or not proto.name:
            proto.name = name  # a reference is imported by its reference name
        files[proto.name] = proto
        return True

    def _get(self, path: str, what: str) -> Any:
        """GET with up to ATTEMPTS tries on a transport error or a 5xx (reads are idempotent; a registry restarting
        or a dropped connection is not worth failing a pass for), then RegistryUnavailable."""
        import httpx

        where = hide_url_password(self.config.url)
        for attempt in range(1, ATTEMPTS + 1):
            try:
                r = self._http.get(path)
            except httpx.HTTPError as exc:
                if attempt < ATTEMPTS:
                    time.sleep(BACKOFF_S * attempt)
                    continue
                raise RegistryUnavailable(f"schema registry {where} unreachable ({what}, {ATTEMPTS} attempts): "
                                          f"{type(exc).__name__}: {self.config.redact(str(exc))[:200]}") from None
            if r.status_code >= 500 and attempt < ATTEMPTS:
                time.sleep(BACKOFF_S * attempt)
                continue
            break
        if r.status_code == 404:
            raise SchemaNotFound(f"{what} is not in the schema registry")
        if r.status_code in (401, 403):
            raise RegistryUnavailable(f"schema registry {where} refused us ({what}): HTTP {r.status_code} (check "
                                      "iceberg.schema.registry.basic.auth.user.info)")
        if r.status_code != 200:
            raise RegistryUnavailable(f"schema registry {where} answered HTTP {r.status_code} for {what}: "
                                      f"{self.config.redact(r.text)[:200]}")
        return r.json()


_clients: dict[RegistryConfig, RegistryClient] = {}
_clients_lock = threading.Lock()


def registry_client(config: RegistryConfig) -> RegistryClient:
    """This process's client for `config` (an executor's Python worker keeps one, with its schema cache, across
    the tasks it runs)."""
    with _clients_lock:
        client = _clients.get(config)
        if client is None:
            client = _clients[config] = RegistryClient(config)
        return client
