"""Sample messages generated from the schemas themselves: every field present in a version gets a value."""

from __future__ import annotations

import random
from typing import Any

from protocol.records import (
    Header,
    Record,
    build_batch,
)
from protocol.schema import F, Message, _in

Data = dict[str, Any]


def sample(message: Message | None, version: int, seed: int = 0, nulls: bool = False) -> Data:
    """A message valid for `version`, filled with values; `nulls` puts null wherever the version allows it."""
    if message is None:
        raise ValueError("an opaque body (no schema) has no sample")
    rnd = random.Random(f"{message.name}-{version}-{seed}")
    return _struct(message.fields, version, message.is_flexible(version), rnd, nulls, depth=0)


def _struct(fields: list[F], version: int, flexible: bool, rnd: random.Random, nulls: bool, depth: int) -> Data:
    d: Data = {}
    for f in fields:
        if not _in(f.versions, version):
            continue
        if f.tag is not None and not flexible:
            continue
        nullable = _in(f.nullable, version)
        if nulls and nullable:
            d[f.name] = None
            continue
        d[f.name] = _value(f, version, flexible, rnd, nulls, depth)
    return d


def _scalar(t: str, rnd: random.Random) -> Any:
    if t == "int8":
        return rnd.randint(-128, 127)
    if t == "int16":
        return rnd.randint(-(1 << 15), (1 << 15) - 1)
    if t == "uint16":
        return rnd.randint(0, (1 << 16) - 1)
    if t == "int32":
        return rnd.randint(-(1 << 31), (1 << 31) - 1)
    if t == "uint32":
        return rnd.randint(0, (1 << 32) - 1)
    if t == "int64":
        return rnd.randint(-(1 << 63), (1 << 63) - 1)
    if t == "float64":
        return rnd.random()
    if t == "bool":
        return rnd.random() < 0.5
    if t == "uuid":
        return rnd.randbytes(16)
    if t == "string":
        return "".join(rnd.choice("abcxyz-._é€") for _ in range(rnd.randint(0, 12)))
    if t == "bytes":
        return rnd.randbytes(rnd.randint(0, 20))
    if t == "records":
        recs = [Record(i, 1_700_000_000_000 + i, rnd.randbytes(3), rnd.randbytes(rnd.randint(0, 400)))
                for i in range(rnd.randint(1, 4))]
        return memoryview(build_batch(recs, base_offset=rnd.randint(0, 1000)))
    raise AssertionError(t)


def _value(f: F, version: int, flexible: bool, rnd: random.Random, nulls: bool, depth: int) -> Any:
    if f.type == "{}":
        return _struct(f.fields or [], version, flexible, rnd, nulls, depth + 1)
    if f.type == "[]":
        return [_struct(f.fields or [], version, flexible, rnd, nulls, depth + 1)
                for _ in range(rnd.randint(1, 3 if depth < 2 else 2))]
    if f.type.startswith("[]"):
        return [_scalar(f.type[2:], rnd) for _ in range(rnd.randint(0, 4))]
    return _scalar(f.type, rnd)


def normalize(value: Any) -> Any:
    """Comparable form: memoryviews as bytes, bookkeeping keys dropped."""
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in value.items() if not k.startswith("_")}
    if isinstance(value, list):
        return [normalize(v) for v in value]
    if isinstance(value, memoryview):
        return bytes(value)
    return value


def projected(decoded: Any, like: Any) -> Any:
    """`decoded` reduced to the keys `like` has (decoders also fill in fields absent from a version)."""
    if isinstance(like, dict) and isinstance(decoded, dict):
        return {k: projected(decoded.get(k), v) for k, v in like.items()}
    if isinstance(like, list) and isinstance(decoded, list) and len(like) == len(decoded):
        return [projected(d, v) for d, v in zip(decoded, like, strict=True)]
    return normalize(decoded)


def records_of(n: int, base: int = 0) -> list[Record]:
    out = []
    for i in range(n):
        key = None if i % 3 == 0 else f"k{i}".encode()
        value = None if i % 5 == 0 else (f"value-{i}-" * (i + 1)).encode()
        headers = [Header("h", b"x" * i), Header("null", None)] if i % 2 else []
        out.append(Record(base + i, 1_700_000_000_000 + i * 7, key, value, headers))
    return out
