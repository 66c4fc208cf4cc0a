"""The pure part of a remote fetch: what a client's Fetch becomes (`FetchPlan`), which partitions are read early
(`plan_fetch`), and how one request's byte budget is spent on them (`fit_budget`, as Kafka's
`ReplicaManager.readFromLog` spends it). No IO: `tests/core` checks it in tables."""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import cast

from protocol import registry
from protocol.apis.fetch_scan import fetch_request_session
from protocol.connection import RequestEvent
from protocol.constants import IsolationLevel
from protocol.framing import HEAD
from protocol.messages import FetchRequest, FetchRequestTopic, FetchRequestTopicPartition, FetchResponse
from protocol.primitives import Buffer
from tierproxy.proxy.session import as_received
from tierproxy.remote.reader import ReadResult

Key = tuple[str | bytes, int]  # (topic name, or topic id from Fetch v13+; partition)
Budget = dict[Key, tuple[int, bool]]  # per partition: (max bytes, at least one batch)
FINAL_EPOCH = -1  # KIP-227: a sessionless full request
EPOCH = struct.Struct(">i")  # session_epoch:int32


@dataclass
class FetchPlan:
    """What one client Fetch becomes: its request (made sessionless, forwarded whole) and the partitions
    expected to be remote (below the broker's local start last time), whose reads start before the broker
    answers. A request forwarded as it came is decoded only if its answer needs the tier (`request`)."""

    decoded: FetchRequest | None  # the request made sessionless; None: decode `source` on first use
    by_id: bool  # v13+: topics named by id
    source: RequestEvent | None = None
    remote: list[Key] = field(default_factory=list)
    reads: dict[Key, asyncio.Task[ReadResult]] = field(default_factory=dict)  # started early for `remote`
    read_from: dict[Key, object] = field(default_factory=dict)  # the tiered partition (its id) each read is of
    budget: Budget = field(default_factory=dict)  # early reads' (max bytes, min one batch)
    rejected: set[Key] = field(default_factory=set)  # early reads a full pool refused
    requested_reads: set[Key] = field(default_factory=set)  # the partitions this fetch's budget reads
    errors: dict[Key, int] = field(default_factory=dict)  # early reads that could not start
    lookups: list[asyncio.Task[object]] = field(default_factory=list)  # the leaders' offsets, the ids: asked early
    deadline: float = 0.0  # loop time: the purgatory's end (remote.fetch.max.wait.ms after arrival)
    reserved: int = 0  # bytes of queued.max.request.bytes held for this response's remote reads
    client_id: str = ""  # whose remote fetch quota the served bytes count against
    as_file: bool = False  # the client's connection sends file regions itself: a file tier may answer with them
    # the client's fetch session (`fetch.sessions`): makes the whole answer the session's; None: sessionless
    session_answer: Callable[[FetchResponse], FetchResponse] | None = None
    started: float = field(default_factory=time.monotonic)

    @property
    def request(self) -> FetchRequest:
        if self.decoded is None:  # kept in `decoded`: decoded once
            assert self.source is not None
            self.decoded = sessionless(decode_fetch_request(self.source))
        return self.decoded

    @cached_property
    def requested(self) -> dict[Key, FetchRequestTopicPartition]:
        """Each requested partition's entry of the request, by key (built once: the budget, the reads and the
        answers all look partitions up in it)."""
        return {key_of(self.by_id, t, p): p for t in self.request["topics"] for p in t["partitions"]}

    @property
    def read_committed(self) -> bool:
        return bool(self.request["isolation_level"] == IsolationLevel.READ_COMMITTED)

    def fetch_offset(self, key: Key) -> int:
        return self.requested[key]["fetch_offset"]


def decode_fetch_request(ev: RequestEvent) -> FetchRequest:
    return cast(FetchRequest, registry.decode_request(ev.header, ev.frame))


def key_of(by_id: bool, topic: FetchRequestTopic, p: FetchRequestTopicPartition) -> Key:
    return (topic["topic_id"] if by_id else topic["topic"], p["partition"])


def plan_fetch(request: FetchRequest, by_id: bool, known: dict[Key, int]) -> FetchPlan:
    """Which partitions to read early: `known` maps a partition this connection reads from the tier to the
    broker's local log start; a fetch below it is expected remote, at or above it is the broker's (forgotten)."""
    plan = FetchPlan(request, by_id)
    for t in request["topics"]:
        for p in t["partitions"]:
            key = key_of(by_id, t, p)
            local_start = known.get(key)
            if local_start is not None and p["fetch_offset"] < local_start:
                plan.remote.append(key)
            elif local_start is not None:
                del known[key]  # caught up with the broker's log: the broker's alone
    return plan


def fit_budget(plan: FetchPlan, keys: list[Key], answered: int, cap: int | None = None,
               holds: Callable[[Key], int] | None = None, slots: int | None = None) -> Budget:
    """One byte budget per request, as `ReplicaManager.readFromLog` keeps it: the request's `max_bytes` less the
    bytes the broker already answered, spent on the remote partitions in request order, each taking up to its
    `partition_max_bytes`. Only the response's first non-empty partition may exceed it (at least one batch:
    `min_one`). Partitions left out get an empty answer with no error and are read on a later fetch; so one fetch
    never starts more reads, nor builds a bigger response, than its budget allows. → {key: (max bytes, min one)}

    Kafka spends the budget on the bytes each read returned, one read after the other; these reads run at once, so
    each takes what it may return before it starts: `holds(key)`, the most one read of that partition can give
    (a read stays in one segment: that segment's size). Without it a partition of a few kilobytes took its whole
    `partition_max_bytes`, and a fetch over many small partitions read fifty of them. `slots`: how many reads the
    reader pool takes now (those it would refuse are left to a later fetch rather than waited for; the first is
    always in, so a pool full of other clients' reads still holds this fetch back to its deadline)."""
    wanted = set(keys)
    remaining = plan.request["max_bytes"] - answered
    if cap is not None:  # a remote fetch quota: what it allows now, and nothing at all when spent
        if cap <= 0:
            return {}
        remaining = min(remaining, cap)
    out: Budget = {}
    for key, p in plan.requested.items():
        if key not in wanted:
            continue
        first = answered == 0 and not out
        if (remaining <= 0 and not first) or (slots is not None and out and len(out) >= slots):
            break
        most = p["partition_max_bytes"] if holds is None else min(p["partition_max_bytes"], holds(key))
        size = most if remaining <= 0 else min(most, remaining)
        out[key] = (size, first)
        remaining -= size
    return out


def sessionless(data: FetchRequest) -> FetchRequest:
    """KIP-227 sessions are not forwarded: sessionless upstream (the broker answers session_id 0, so the client
    keeps sending full requests)."""
    data["session_id"], data["session_epoch"], data["forgotten_topics_data"] = 0, -1, []
    return data


def as_full_request(ev: RequestEvent) -> list[Buffer] | None:
    """The request to forward without decoding it, when it asks for no session state: sessionless as it came, or
    a full request (epoch 0) made sessionless by rewriting its epoch (a full request's forgotten topics are
    ignored by the broker). None: it refers to a session (incremental), and goes through the full decode."""
    found = fetch_request_session(ev.frame, ev.header.api_version, ev.header.body_offset)
    if found is None or found[:2] == (0, FINAL_EPOCH):
        return as_received(ev)
    if found[:2] != (0, 0) or ev.wire is None:
        return None
    wire = bytearray(ev.wire)
    EPOCH.pack_into(wire, HEAD + found[2] + 4, FINAL_EPOCH)
    return [wire]
