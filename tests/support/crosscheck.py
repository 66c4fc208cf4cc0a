"""kafka-python 3.x (an independent, JSON-driven codec) used only in tests to cross-check our decoding."""

from __future__ import annotations

import uuid
import warnings
from typing import Any

with warnings.catch_warnings():
    # kafka-python loads its schemas with the deprecated importlib.resources.read_text at import time
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol import admin, consumer, metadata
    from kafka.protocol import producer as kp_producer

from tests.support.samples import normalize

THEIRS: dict[tuple[int, str], Any] = {
    (1, "request"): consumer.FetchRequest, (1, "response"): consumer.FetchResponse,
    (2, "request"): consumer.ListOffsetsRequest, (2, "response"): consumer.ListOffsetsResponse,
    (23, "request"): consumer.OffsetForLeaderEpochRequest, (23, "response"): consumer.OffsetForLeaderEpochResponse,
    (21, "request"): admin.DeleteRecordsRequest, (21, "response"): admin.DeleteRecordsResponse,
    (3, "request"): metadata.MetadataRequest, (3, "response"): metadata.MetadataResponse,
    (10, "request"): metadata.FindCoordinatorRequest, (10, "response"): metadata.FindCoordinatorResponse,
    (18, "request"): metadata.ApiVersionsRequest, (18, "response"): metadata.ApiVersionsResponse,
    (0, "response"): kp_producer.ProduceResponse,
}


def theirs_decode(api_key: int, kind: str, version: int, body: bytes) -> dict[str, Any] | None:
    cls = THEIRS.get((api_key, kind))
    if cls is None:
        return None
    d: dict[str, Any] = cls.decode(body, version=version).to_dict(json=False)
    return d


def _norm_theirs(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _norm_theirs(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_norm_theirs(x) for x in v]
    if isinstance(v, uuid.UUID):
        return v.bytes
    if isinstance(v, bytearray | memoryview):
        return bytes(v)
    return v


def common_fields_differ(ours: Any, theirs: Any, path: str = "") -> list[str]:
    """Paths where the two decodings disagree, over the fields both have (names follow Kafka's JSON)."""
    ours, theirs = normalize(ours), _norm_theirs(theirs)
    diffs: list[str] = []
    _diff(ours, theirs, path, diffs)
    return diffs


def _diff(a: Any, b: Any, path: str, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in a.keys() & b.keys():
            _diff(a[k], b[k], f"{path}.{k}", out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{path}: {len(a)} items vs {len(b)}")
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            _diff(x, y, f"{path}[{i}]", out)
    elif (isinstance(a, dict) and b is None) or (a is None and isinstance(b, dict)):
        return  # absent tagged struct: None on one side, all-default struct on the other
    elif a == bytes(16) and b is None:
        return  # kafka-python reads the zero UUID as None
    elif a != b:
        out.append(f"{path}: {a!r} vs {b!r}")
