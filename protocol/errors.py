"""The one error type of the codec: every malformed input raises `ProtocolError` and nothing else."""

from __future__ import annotations


class ProtocolError(Exception):
    """Malformed or unsupported Kafka wire data, with the API, version and field where known."""

    def __init__(self, message: str, *, api_key: int | None = None, api_version: int | None = None,
                 field: str | None = None) -> None:
        self.reason = message
        self.api_key = api_key
        self.api_version = api_version
        self.field = field
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.api_key is not None:
            where.append(f"api_key={self.api_key}")
        if self.api_version is not None:
            where.append(f"version={self.api_version}")
        if self.field:
            where.append(f"field={self.field}")
        return f"{self.reason} ({', '.join(where)})" if where else self.reason

    def with_context(self, *, api_key: int | None = None, api_version: int | None = None,
                     field: str | None = None) -> ProtocolError:
        """The same error with context added; field names build a path from the outside in (`topics.partitions`)."""
        path = f"{field}.{self.field}" if field and self.field else (field or self.field)
        return ProtocolError(self.reason,
                             api_key=self.api_key if self.api_key is not None else api_key,
                             api_version=self.api_version if self.api_version is not None else api_version,
                             field=path)
