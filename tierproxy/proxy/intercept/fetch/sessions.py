"""KIP-227 fetch sessions held by the proxy toward a client that reads the tier.

A consumer of thousands of partitions names every one of them in every sessionless Fetch, and gets an entry for
every one back: its own work per fetch, and the proxy's, follow the partitions it is assigned, not those with data.
With a session, it names only the partitions whose fetch position changed, and gets only the partitions with
something new. Upstream stays sessionless: the proxy expands each request to the whole session (the broker still
answers, and authorizes, every partition), and filters the answer.

The rules, as Kafka's `FetchSession`/`FetchSessionHandler` keep them:
- a full request with epoch 0 (session id 0) asks for a session; the proxy grants one (a non-zero id in the answer)
  only to a connection that reads the tier in that fetch, and only within `SESSION_PARTITIONS` across the process;
  otherwise it answers session id 0 and the client goes on with full requests, as before; a session an
  incremental request would grow past the bound ends (FETCH_SESSION_ID_NOT_FOUND, as a broker's evicted one);
- an incremental request (the session's id, the next epoch) adds or updates the partitions it names and removes its
  forgotten topics; an unknown id (or id 0) is answered FETCH_SESSION_ID_NOT_FOUND, a wrong epoch
  INVALID_FETCH_SESSION_EPOCH and a version on the other side of v13 than the session's FETCH_SESSION_TOPIC_ID_ERROR,
  all top-level and without partitions: the client starts a new session;
- epoch -1 with the session's id closes it (the request is a sessionless full one);
- an incremental answer holds a partition only with records, an error, a preferred read replica or a diverging
  epoch (every time, as Kafka's `CachedPartition.maybeUpdateResponseData`), or a high watermark, last stable offset,
  log start, leader or snapshot different from what it last sent (after an error: listed again once it clears); a
  partition answered with records goes last in the session's order (the next fetch's budget goes to the others
  first, as Kafka's sessions rotate);
- a session whose connection no longer reads the tier is ended (FETCH_SESSION_ID_NOT_FOUND on its next request):
  the client's next full request gets no session, and its fetches are relayed as they come again. A full or
  closing request ends the session its connection held, whichever path it takes.
"""

from __future__ import annotations

import random
from typing import Any

from protocol.constants import ErrorCode
from protocol.messages import FetchRequest, FetchRequestTopicPartition, FetchResponse
from tierproxy.proxy.intercept.fetch.plan import FINAL_EPOCH, Key, key_of

# partitions held in sessions across the process (~0.75 KB each with its decoded request entry, tracemalloc):
# ~150 MB at most
SESSION_PARTITIONS = 200_000
SESSION_ID_NOT_FOUND = 70  # FETCH_SESSION_ID_NOT_FOUND
INVALID_SESSION_EPOCH = 71  # INVALID_FETCH_SESSION_EPOCH
SESSION_TOPIC_ID_ERROR = 106  # FETCH_SESSION_TOPIC_ID_ERROR
_held = 0  # partitions in open sessions, process-wide


class FetchSession:
    """One client's session: its partitions (request order, as the request's entries) and what was last sent."""

    def __init__(self, data: FetchRequest, by_id: bool) -> None:
        self.id = random.randint(1, 2**31 - 1)
        self.epoch = 1  # the epoch the next request must carry
        self.by_id = by_id
        self.parts: dict[Key, tuple[str, bytes, FetchRequestTopicPartition]] = {}
        self.sent: dict[Key, tuple[Any, ...] | None] = {}
        self._update(data)
        self.held = 0
        self._hold()

    @staticmethod
    def fits(data: FetchRequest) -> bool:
        return _held + sum(len(t["partitions"]) for t in data["topics"]) <= SESSION_PARTITIONS

    def _hold(self) -> None:
        global _held
        _held += len(self.parts) - self.held
        self.held = len(self.parts)

    def grows_past_bound(self, data: FetchRequest) -> bool:
        """An incremental request would add more partitions than the process-wide bound has room for."""
        named = {key_of(self.by_id, t, p) for t in data["topics"] for p in t["partitions"]}
        forgotten = {(f["topic_id"] if self.by_id else f["topic"], n) for f in data["forgotten_topics_data"]
                     for n in f["partitions"]}
        after = len((self.parts.keys() | named) - forgotten)  # as `apply` leaves it: updated, then forgotten
        return _held + after - self.held > SESSION_PARTITIONS

    def release(self) -> None:
        """The session ends (closed, refused or its connection gone): its partitions no longer count."""
        global _held
        _held -= self.held
        self.held = 0

    def _update(self, data: FetchRequest) -> None:
        for t in data["topics"]:
            for p in t["partitions"]:
                self.parts[key_of(self.by_id, t, p)] = (t["topic"], t["topic_id"], p)

    def apply(self, data: FetchRequest) -> FetchRequest:
        """An incremental request applied (its partitions, then its forgotten topics); returns the whole session as a
        sessionless full request to forward."""
        self._update(data)
        for f in data["forgotten_topics_data"]:
            for n in f["partitions"]:
                key: Key = (f["topic_id"] if self.by_id else f["topic"], n)
                self.parts.pop(key, None)
                self.sent.pop(key, None)
        self._hold()
        self.epoch = 1 if self.epoch >= 2**31 - 1 else self.epoch + 1
        return self.full_request(data)

    def full_request(self, data: FetchRequest) -> FetchRequest:
        topics: dict[tuple[str, bytes], list[FetchRequestTopicPartition]] = {}
        for name, topic_id, p in self.parts.values():
            topics.setdefault((name, topic_id), []).append(p)
        out = data.copy()
        out["topics"] = [{"topic": name, "topic_id": topic_id, "partitions": parts}
                         for (name, topic_id), parts in topics.items()]
        out["session_id"], out["session_epoch"], out["forgotten_topics_data"] = 0, FINAL_EPOCH, []
        return out

    def answer(self, response: FetchResponse, full: bool) -> FetchResponse:
        """The whole answer to the expanded request as this session's answer: every partition for a full request,
        only those with something new for an incremental one; records what was sent."""
        response["session_id"] = self.id
        topics = []
        for t in response["responses"]:
            kept = []
            for p in t["partitions"]:
                key: Key = (t["topic_id"] if self.by_id else t["topic"], p["partition_index"])
                shown = (p["high_watermark"], p["last_stable_offset"], p["log_start_offset"], p["current_leader"],
                         p["snapshot_id"])
                has_records = len(p["records"] or b"") > 0
                failed = p["error_code"] != ErrorCode.NONE
                # as Kafka's `CachedPartition.maybeUpdateResponseData`: records, an error, a preferred read replica
                # or a diverging epoch are listed every time (a client that could not act on one learns it again)
                diverging = p["diverging_epoch"] is not None and p["diverging_epoch"]["epoch"] >= 0
                if full or has_records or failed or p["preferred_read_replica"] >= 0 or diverging \
                        or self.sent.get(key) != shown:
                    kept.append(p)
                    self.sent[key] = None if failed else shown  # after an error, listed again once it clears
                if has_records and key in self.parts:  # last in the next fetch's order, as Kafka's sessions keep it
                    self.parts[key] = self.parts.pop(key)
            if kept:
                t["partitions"] = kept
                topics.append(t)
        response["responses"] = topics
        return response


def session_error(code: int) -> FetchResponse:
    """A top-level session error, no partitions: the client drops its session and sends a full request."""
    return {"throttle_time_ms": 0, "error_code": code, "session_id": 0, "responses": [], "node_endpoints": []}


def held() -> int:
    """Partitions held in open sessions, process-wide."""
    return _held
