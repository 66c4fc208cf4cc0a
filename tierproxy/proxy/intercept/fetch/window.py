"""The authorization window (`remote.authorization.cache.ms`, off by default): a connection whose fetch of a topic
the broker authorized a moment ago reads on from the tier without the broker's round trip.

Every remote fetch is normally forwarded, and the tier answers only where the broker's answer to that request is
OFFSET_OUT_OF_RANGE (which it gives only to a client allowed to READ the topic). That round trip is most of a
remote fetch's latency, and a consumer catching up sends the next fetch only when the last one is answered. With
a window of W ms, a request is answered from the tier alone when all of these hold:

- every partition it asks for is one this connection reads from the tier (below the broker's log start last
  time) and the tier holds its fetch offset: anything else goes to the broker as always;
- the broker authorized this connection's fetch of each of its topics (answered OFFSET_OUT_OF_RANGE) for a
  request made less than W ms ago: a fresh connection, or one whose ACL was revoked, is asked again within W.

The answer is what the broker's OFFSET_OUT_OF_RANGE would have led to (`DelayedRemoteFetch.complete` on an empty
broker part). The trade-off, documented in docs/proxy.md: an ACL revoked while a consumer reads history stops its tier
reads within W rather than at once. Sessions are unaffected: remote fetches are forwarded sessionless anyway."""

from __future__ import annotations

import time
from collections.abc import Iterable

from protocol.constants import ErrorCode
from protocol.messages import FetchResponse, FetchResponseResponse
from tierproxy.proxy.intercept.errors import LOADING
from tierproxy.proxy.intercept.fetch.answer import partition_entry
from tierproxy.proxy.intercept.fetch.delayed import DelayedRemoteFetch
from tierproxy.proxy.intercept.fetch.plan import FetchPlan, Key


def broker_decided(authorized: dict[str | bytes, float], plan: FetchPlan, oor: list[Key],
                   errors: Iterable[tuple[str | bytes, int, int]]) -> None:
    """What the broker's answer to a forwarded request says of this connection's reads: OFFSET_OUT_OF_RANGE for
    `oor` (the tier answers them) authorized their topics, counted from the request's arrival, before the
    broker's check; TOPIC_AUTHORIZATION_FAILED ends a topic's window at once."""
    for topic, _ in oor:
        if authorized.get(topic, 0.0) < plan.started:
            authorized[topic] = plan.started
    for topic, _, code in errors:
        if code == ErrorCode.TOPIC_AUTHORIZATION_FAILED:
            authorized.pop(topic, None)


def within_window(authorized: dict[str | bytes, float], window_ms: int, op: DelayedRemoteFetch) -> bool:
    """The request can be answered from the tier without the broker (see the module's rules)."""
    plan = op.plan
    if window_ms <= 0 or not plan.remote or not op.tier.serving or len(plan.remote) != len(plan.requested):
        return False
    oldest = time.monotonic() - window_ms / 1000
    return all(authorized.get(key[0], -1.0) > oldest and op.tier_answers(key) for key in plan.remote)


def no_broker_part(plan: FetchPlan) -> FetchResponse:
    """The broker's part of an answer made without it: every partition retriable (REPLICA_NOT_AVAILABLE) until
    the tier's entry replaces it; one the tier no longer answers by then (its topic's current id changed) is
    asked again and goes to the broker."""
    topics: list[FetchResponseResponse] = []
    for t in plan.request["topics"]:
        parts = []
        for p in t["partitions"]:
            entry = partition_entry(p["partition"], None, None, None)
            entry["error_code"] = LOADING
            parts.append(entry)
        topics.append({"topic": t["topic"], "topic_id": t["topic_id"], "partitions": parts})
    return {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": topics, "node_endpoints": []}
