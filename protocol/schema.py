"""Message schemas as data, and the interpreter that decodes and encodes them.

A schema is a `Message` holding `F` field declarations transcribed from Apache Kafka's
``clients/src/main/resources/common/message/*.json`` (names in snake_case, the same version ranges).
Each (message, version) is compiled once into a plan of reader/writer functions.

Decoded messages are plain dicts. Fields absent in a version carry their default; structs in flexible
versions keep the tags they carried (``_tags``) and unknown tagged fields verbatim (``_unknown``) so a
decode/encode round trip is byte-exact. Record sets are `memoryview` slices of the input.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from protocol.errors import ProtocolError
from protocol.primitives import Reader, Writer, buffers

Data = dict[str, Any]
MessageIn = Mapping[str, Any]  # what the encoders take: a decoded dict or a typed message (protocol.messages)
ReadFn = Callable[[Reader], Any]
WriteFn = Callable[[Writer, Any], None]
_MISSING: Any = object()
# tag → (name, read, write, default, nullable)
TaggedPlan = dict[int, tuple[str, ReadFn, WriteFn, Callable[[], Any], bool]]

_SCALARS = {"int8", "int16", "uint16", "int32", "uint32", "int64", "float64", "bool", "uuid",
            "string", "bytes", "records"}
_ZERO_UUID = bytes(16)


def parse_versions(spec: str) -> tuple[int, int]:
    """'0+' → (0, 32767); '3-5' → (3, 5); 'none' → (1, 0) (an empty range)."""
    if spec == "none":
        return (1, 0)
    if spec.endswith("+"):
        return (int(spec[:-1]), 0x7FFF)
    lo, _, hi = spec.partition("-")
    return (int(lo), int(hi or lo))


def _in(spec: str | None, v: int) -> bool:
    if spec is None:
        return False
    lo, hi = parse_versions(spec)
    return lo <= v <= hi


@dataclass(frozen=True)
class F:
    """One field: name, type ('int32', 'string', '[]int32', '[]' = array of `fields`, '{}' = struct), versions."""

    name: str
    type: str
    versions: str
    nullable: str | None = None
    tag: int | None = None
    tagged: str | None = None
    default: Any = _MISSING
    fields: list[F] | None = None

    def __post_init__(self) -> None:
        base = self.type[2:] if self.type.startswith("[]") else self.type
        if base not in _SCALARS and base not in ("", "{}") and self.type != "{}":
            raise ValueError(f"unknown field type {self.type!r} for {self.name}")

    def default_factory(self) -> Callable[[], Any]:
        if self.default is not _MISSING:
            d = self.default
            return lambda: d
        t = self.type
        if t.startswith("[]"):
            return list
        if t == "{}" or t == "records":
            return lambda: None
        if t == "string":
            return lambda: ""
        if t == "bytes":
            return lambda: b""
        if t == "bool":
            return lambda: False
        if t == "uuid":
            return lambda: _ZERO_UUID
        if t == "float64":
            return lambda: 0.0
        return lambda: 0


@dataclass
class StructPlan:
    regular: list[tuple[str, ReadFn, WriteFn, Callable[[], Any]]] = field(default_factory=list)
    absent: list[tuple[str, Callable[[], Any]]] = field(default_factory=list)
    tagged: TaggedPlan = field(default_factory=dict)
    flexible: bool = False


def _scalar_fns(t: str, nullable: bool, flex: bool) -> tuple[ReadFn, WriteFn]:
    if t in ("int8", "int16", "uint16", "int32", "uint32", "int64", "float64", "bool", "uuid"):
        name = "boolean" if t == "bool" else t
        return getattr(Reader, name), getattr(Writer, name)
    rd: ReadFn
    if t == "string":
        if flex:
            rd = Reader.compact_nullable_string if nullable else Reader.compact_string
        else:
            rd = Reader.nullable_string if nullable else Reader.string
        return rd, lambda w, v: w.string(v, flex)
    # bytes and records: zero-copy views
    if flex:
        rd = Reader.compact_nullable_bytes_view if nullable else Reader.compact_bytes_view
    else:
        rd = Reader.nullable_bytes_view if nullable else Reader.bytes_view
    zero_copy = t == "records"
    return rd, lambda w, v: w.bytes_(v, flex, zero_copy)


def _array_fns(item_rd: ReadFn, item_wr: WriteFn, nullable: bool, flex: bool) -> tuple[ReadFn, WriteFn]:
    def read(r: Reader) -> list[Any] | None:
        n = r.compact_array_len() if flex else r.array_len()
        if n < 0:
            if not nullable:
                raise ProtocolError("null in non-nullable array")
            return None
        return [item_rd(r) for _ in range(n)]

    def write(w: Writer, v: list[Any] | None) -> None:
        if v is None:
            w.array_len(None, flex)
            return
        w.array_len(len(v), flex)
        for item in v:
            item_wr(w, item)

    return read, write


def _is_default(v: Any, factory: Callable[[], Any]) -> bool:
    if v is None:
        return True
    d = factory()
    if isinstance(d, list):
        return not v
    return bool(v == d)


def compile_struct(fields: list[F], version: int, flexible: bool) -> StructPlan:
    """Compile the fields present in `version` into reader/writer functions."""
    plan = StructPlan(flexible=flexible)
    for f in fields:
        factory = f.default_factory()
        if not _in(f.versions, version):
            plan.absent.append((f.name, factory))
            continue
        tagged = f.tag is not None and flexible and _in(f.tagged or f.versions, version)
        if f.tag is not None and not tagged:
            plan.absent.append((f.name, factory))
            continue
        nullable = _in(f.nullable, version)
        rd, wr = _field_fns(f, version, flexible, nullable)
        if tagged:
            assert f.tag is not None
            plan.tagged[f.tag] = (f.name, rd, wr, factory, f.type == "{}")
        else:
            plan.regular.append((f.name, rd, wr, factory))
    return plan


def _field_fns(f: F, version: int, flex: bool, nullable: bool) -> tuple[ReadFn, WriteFn]:
    if f.type == "{}" or f.type == "[]":
        sub = compile_struct(f.fields or [], version, flex)
        rd, wr = _struct_fns(sub)
        if f.type == "{}":
            return rd, wr
        return _array_fns(rd, wr, nullable, flex)
    if f.type.startswith("[]"):
        item_rd, item_wr = _scalar_fns(f.type[2:], False, flex)
        return _array_fns(item_rd, item_wr, nullable, flex)
    return _scalar_fns(f.type, nullable, flex)


def _struct_fns(plan: StructPlan) -> tuple[ReadFn, WriteFn]:
    regular, absent, tagged, flexible = plan.regular, plan.absent, plan.tagged, plan.flexible

    def read(r: Reader) -> Data:
        d: Data = {}
        for name, rd, _, _ in regular:
            try:
                d[name] = rd(r)
            except ProtocolError as exc:
                raise exc.with_context(field=name) from None
        for name, factory in absent:
            d[name] = factory()
        if flexible:
            for name, _, _, factory, _ in tagged.values():
                d[name] = factory()
            _read_tagged(r, d, tagged)
        return d

    def write(w: Writer, d: MessageIn) -> None:
        for name, _, wr, factory in regular:
            v = d.get(name, _MISSING)
            try:
                wr(w, factory() if v is _MISSING else v)
            except ProtocolError as exc:
                raise exc.with_context(field=name) from None
            except (TypeError, ValueError, OverflowError, AttributeError) as exc:
                raise ProtocolError(f"cannot encode {v!r}: {exc}", field=name) from None
        if flexible:
            _write_tagged(w, d, tagged)

    return read, write


def _read_tagged(r: Reader, d: Data, tagged: TaggedPlan) -> None:
    count = r.unsigned_varint()
    if count > r.remaining():
        raise ProtocolError(f"tagged field count {count} exceeds the bytes left")
    last = -1
    present: list[int] = []
    unknown: list[tuple[int, bytes]] = []
    for _ in range(count):
        tag = r.unsigned_varint()
        size = r.unsigned_varint()
        if tag <= last:
            raise ProtocolError(f"tagged field {tag} out of order or repeated", field="_tagged")
        last = tag
        start = r.pos
        end = start + size
        if end > r.end:
            raise ProtocolError(f"tagged field {tag} of {size} bytes runs past the end", field="_tagged")
        spec = tagged.get(tag)
        if spec is None:
            unknown.append((tag, bytes(r.buf[start:end])))
        else:
            sub = Reader(r.buf, start, end)
            try:
                d[spec[0]] = spec[1](sub)
            except ProtocolError as exc:
                raise exc.with_context(field=spec[0]) from None
            if sub.pos != end:
                raise ProtocolError(f"tagged field {tag} has {end - sub.pos} unread bytes", field=spec[0])
            present.append(tag)
        r.pos = end
    if present:
        d["_tags"] = tuple(present)
    if unknown:
        d["_unknown"] = unknown


def _write_tagged(w: Writer, d: MessageIn, tagged: TaggedPlan) -> None:
    present = d.get("_tags", ())
    items: list[tuple[int, bytes | bytearray]] = list(d.get("_unknown", ()))
    for tag, (name, _, wr, factory, _) in tagged.items():
        v = d.get(name, None)
        if tag in present or not _is_default(v, factory):
            sub = Writer()
            try:
                wr(sub, factory() if v is None and tag in present else v)
            except (TypeError, ValueError, OverflowError, AttributeError) as exc:
                raise ProtocolError(f"cannot encode {v!r}: {exc}", field=name) from None
            items.append((tag, b"".join(buffers(sub.finish()))))
    items.sort(key=lambda t: t[0])
    w.unsigned_varint(len(items))
    for tag, data in items:
        w.unsigned_varint(tag)
        w.unsigned_varint(len(data))
        w.raw(data)


class Message:
    """One request or response schema: its api key, version range, first flexible version and fields."""

    def __init__(self, name: str, api_key: int, versions: str, flexible: str, fields: list[F]) -> None:
        self.name = name
        self.api_key = api_key
        self.min_version, self.max_version = parse_versions(versions)
        self.flexible_from = parse_versions(flexible)[0] if flexible != "none" else 0x7FFF
        self.fields = fields
        self._plans: dict[int, tuple[ReadFn, WriteFn]] = {}

    def is_flexible(self, version: int) -> bool:
        return version >= self.flexible_from

    def _fns(self, version: int) -> tuple[ReadFn, WriteFn]:
        fns = self._plans.get(version)
        if fns is None:
            if not self.min_version <= version <= self.max_version:
                raise ProtocolError(f"{self.name} v{version} is not supported "
                                    f"(v{self.min_version}-v{self.max_version})",
                                    api_key=self.api_key, api_version=version)
            fns = _struct_fns(compile_struct(self.fields, version, self.is_flexible(version)))
            self._plans[version] = fns
        return fns

    def decode(self, buf: memoryview, version: int, pos: int = 0, end: int | None = None) -> Data:
        """Decode the body that spans buf[pos:end] exactly; raise `ProtocolError` on anything malformed."""
        read = self._fns(version)[0]
        r = Reader(buf, pos, end)
        try:
            d: Data = read(r)
        except ProtocolError as exc:
            raise exc.with_context(api_key=self.api_key, api_version=version) from None
        if r.pos != r.end:
            raise ProtocolError(f"{self.name}: {r.end - r.pos} trailing bytes", api_key=self.api_key,
                                api_version=version)
        return d

    def encode_into(self, w: Writer, data: MessageIn, version: int) -> None:
        write = self._fns(version)[1]
        try:
            write(w, data)
        except ProtocolError as exc:
            raise exc.with_context(api_key=self.api_key, api_version=version) from None

    def encode(self, data: MessageIn, version: int) -> bytes:
        """Encode to one bytes object (copies record sets: for tests and small messages)."""
        w = Writer()
        self.encode_into(w, data, version)
        return b"".join(buffers(w.finish()))
