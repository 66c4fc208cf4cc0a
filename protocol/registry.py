"""The APIs the codec decodes, their version ranges (used by the proxy to cap ApiVersions), and helpers.

Any API not listed here is carried as an opaque frame: header decoded, body untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.apis import admin, discovery, fetch, offsets, produce, sasl
from protocol.constants import ApiKey
from protocol.errors import ProtocolError
from protocol.framing import frame_header
from protocol.headers import RequestHeader, encode_response_header, response_header_version
from protocol.primitives import Buffer, Chunk, Writer, buffers
from protocol.schema import Data, Message, MessageIn

Chunks = list[Chunk]  # record sets as their own chunks: views, or file regions the transport sends


@dataclass(frozen=True)
class ApiSchema:
    """A decodable API: request schema (None = opaque body) and response schema over one version range."""

    api_key: int
    name: str
    request: Message | None
    response: Message

    @property
    def min_version(self) -> int:
        return self.response.min_version

    @property
    def max_version(self) -> int:
        return self.response.max_version


SUPPORTED: dict[int, ApiSchema] = {s.api_key: s for s in (
    ApiSchema(0, "Produce", None, produce.PRODUCE_RESPONSE),
    ApiSchema(1, "Fetch", fetch.FETCH_REQUEST, fetch.FETCH_RESPONSE),
    ApiSchema(2, "ListOffsets", offsets.LIST_OFFSETS_REQUEST, offsets.LIST_OFFSETS_RESPONSE),
    ApiSchema(3, "Metadata", discovery.METADATA_REQUEST, discovery.METADATA_RESPONSE),
    ApiSchema(10, "FindCoordinator", discovery.FIND_COORDINATOR_REQUEST, discovery.FIND_COORDINATOR_RESPONSE),
    ApiSchema(17, "SaslHandshake", sasl.SASL_HANDSHAKE_REQUEST, sasl.SASL_HANDSHAKE_RESPONSE),
    ApiSchema(18, "ApiVersions", discovery.API_VERSIONS_REQUEST, discovery.API_VERSIONS_RESPONSE),
    ApiSchema(21, "DeleteRecords", offsets.DELETE_RECORDS_REQUEST, offsets.DELETE_RECORDS_RESPONSE),
    ApiSchema(23, "OffsetForLeaderEpoch", offsets.OFFSET_FOR_LEADER_EPOCH_REQUEST,
              offsets.OFFSET_FOR_LEADER_EPOCH_RESPONSE),
    ApiSchema(36, "SaslAuthenticate", sasl.SASL_AUTHENTICATE_REQUEST, sasl.SASL_AUTHENTICATE_RESPONSE),
    ApiSchema(60, "DescribeCluster", discovery.DESCRIBE_CLUSTER_REQUEST, discovery.DESCRIBE_CLUSTER_RESPONSE),
)}


# APIs only tierproxy's own clients send (restore, the tier job): the proxy carries them opaque, so they cap no
# client's versions; Produce's request is declared here for the same reason.
OWN: dict[int, ApiSchema] = {s.api_key: s for s in (
    ApiSchema(0, "Produce", admin.PRODUCE_REQUEST, produce.PRODUCE_RESPONSE),
    ApiSchema(8, "OffsetCommit", admin.OFFSET_COMMIT_REQUEST, admin.OFFSET_COMMIT_RESPONSE),
    ApiSchema(9, "OffsetFetch", admin.OFFSET_FETCH_REQUEST, admin.OFFSET_FETCH_RESPONSE),
    ApiSchema(16, "ListGroups", admin.LIST_GROUPS_REQUEST, admin.LIST_GROUPS_RESPONSE),
    ApiSchema(22, "InitProducerId", admin.INIT_PRODUCER_ID_REQUEST, admin.INIT_PRODUCER_ID_RESPONSE),
    ApiSchema(43, "ElectLeaders", admin.ELECT_LEADERS_REQUEST, admin.ELECT_LEADERS_RESPONSE),
    ApiSchema(45, "AlterPartitionReassignments", admin.ALTER_PARTITION_REASSIGNMENTS_REQUEST,
              admin.ALTER_PARTITION_REASSIGNMENTS_RESPONSE),
)}


def own_schema(api_key: int) -> ApiSchema:
    """The schema tierproxy's own clients use for `api_key`: their own declaration first, else the proxy's."""
    s = OWN.get(api_key)
    return s if s is not None else schema(api_key)


def schema(api_key: int) -> ApiSchema:
    s = SUPPORTED.get(api_key)
    if s is None:
        raise ProtocolError("API is not decoded by this codec (opaque)", api_key=api_key)
    return s


def supports(api_key: int, api_version: int) -> bool:
    s = SUPPORTED.get(api_key)
    return s is not None and s.min_version <= api_version <= s.max_version


def decode_request(header: RequestHeader, frame: memoryview) -> Data:
    """Decode the body of a request frame whose header is `header`."""
    req = schema(header.api_key).request
    if req is None:
        raise ProtocolError("request body is opaque", api_key=header.api_key, api_version=header.api_version)
    return req.decode(frame, header.api_version, header.body_offset)


def decode_response(api_key: int, api_version: int, frame: memoryview, body_offset: int) -> Data:
    """Decode a response body. An ApiVersions response that does not parse at the request's version is read
    as v0, as the Java client does: a broker answers a version it does not know with a v0 UNSUPPORTED_VERSION."""
    response = own_schema(api_key).response
    try:
        return response.decode(frame, api_version, body_offset)
    except ProtocolError:
        if api_key != ApiKey.API_VERSIONS or api_version == 0:
            raise
        return response.decode(frame, 0, body_offset)


def encode_request(header: RequestHeader, data: MessageIn) -> list[Buffer]:
    """A whole request frame (size prefix, header, body) as chunks; record sets are not copied."""
    req = own_schema(header.api_key).request
    if req is None:
        raise ProtocolError("request body is opaque", api_key=header.api_key)
    w = Writer()
    w.raw(header.encode())
    req.encode_into(w, data, header.api_version)
    return buffers(_framed(w.finish()))


def encode_response(api_key: int, api_version: int, correlation_id: int, data: MessageIn) -> Chunks:
    """A whole response frame (size prefix, header, body) as chunks; record sets are not copied."""
    w = Writer()
    w.raw(encode_response_header(correlation_id, response_header_version(api_key, api_version)))
    schema(api_key).response.encode_into(w, data, api_version)
    return _framed(w.finish())


def joined(chunks: Chunks) -> bytes:
    """Encoded chunks as one bytes object (a copy: for tests and small messages); ProtocolError for a file region."""
    return b"".join(buffers(chunks))


def _framed(chunks: Chunks) -> Chunks:
    size = sum(len(c) for c in chunks)
    return [frame_header(size), *chunks]
