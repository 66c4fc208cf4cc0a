"""What each commit records, and reading it back: the table's own exactly-once ledger.

The ledger is a table property (`tierproxy.ledger`, the JSON of ends, starts and topics), set in the same commit as
the rows it describes: another writer's commits and snapshot expiry cannot remove it. Each commit's snapshot summary
carries it too, as its history (`snapshot-at` reads that); a table written before the property existed is read
from the newest summary that carries it. The summary's keys:

    tierproxy.ends      {"<topic id>:<partition>": next offset}: the table holds every visible record below it
    tierproxy.starts    {"<topic id>:<partition>": offset}: no row below it (the tier's start when last followed)
    tierproxy.topics    {"<topic>": "<topic id>"}: each topic's current incarnation (the one passes add rows of)
    tierproxy.ids       {"<topic id>": "<topic>"}: every incarnation the table holds rows of (two of one topic
                        under `iceberg.retention=keep` after it was re-created; each row's topic id column says
                        which); a ledger from before it: the current incarnations'
    tierproxy.segments  the tiered segment ids this commit added
    tierproxy.pass      the pass that made the commit

A pass reads the ledger and adds only segments at or past `ends`, in the same commit as the new `ends`. A pass
killed before its commit leaves the ledger as it was, so the next pass writes the same segments again and nothing
twice; one killed after it finds its segments recorded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

ENDS, STARTS, TOPICS, SEGMENTS, PASS, IDS = ("tierproxy.ends", "tierproxy.starts", "tierproxy.topics",
                                             "tierproxy.segments", "tierproxy.pass", "tierproxy.ids")
LEDGER = "tierproxy.ledger"  # the table property holding the current ledger
WRITER = "tierproxy.writer"  # the lease of the pass writing data files now (`writer`; released by its commit)


@dataclass
class Ledger:
    ends: dict[str, int] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)
    topics: dict[str, str] = field(default_factory=dict)
    snapshot_id: int | None = None
    ids: dict[str, str] = field(default_factory=dict)  # every incarnation held: topic id → topic

    def __post_init__(self) -> None:
        for topic, tid in self.topics.items():  # a current incarnation is held (a ledger from before `ids` too)
            self.ids.setdefault(tid, topic)

    def copy(self) -> Ledger:
        """A copy to change (the snapshot it was read from left out)."""
        return Ledger(dict(self.ends), dict(self.starts), dict(self.topics), ids=dict(self.ids))

    def incarnations(self, topic: str) -> list[str]:
        """The ids of `topic` the table holds rows of."""
        return sorted(tid for tid, name in self.ids.items() if name == topic)

    def property(self) -> str:
        """The ledger as the table property's value."""
        return json.dumps({"ends": self.ends, "starts": self.starts, "topics": self.topics, "ids": self.ids},
                          sort_keys=True)

    def summary(self, pass_id: str, segments: list[str]) -> dict[str, str]:
        return {ENDS: json.dumps(self.ends, sort_keys=True), STARTS: json.dumps(self.starts, sort_keys=True),
                TOPICS: json.dumps(self.topics, sort_keys=True), IDS: json.dumps(self.ids, sort_keys=True),
                SEGMENTS: ",".join(segments), PASS: pass_id}


def _props(snapshot: Any) -> dict[str, str]:
    summary = snapshot.summary
    return dict(summary.additional_properties) if summary is not None else {}


def ledger_of(snapshot: Any) -> Ledger | None:
    props = _props(snapshot)
    if ENDS not in props:
        return None
    return Ledger({k: int(v) for k, v in json.loads(props[ENDS]).items()},
                  {k: int(v) for k, v in json.loads(props.get(STARTS, "{}")).items()},
                  json.loads(props.get(TOPICS, "{}")), snapshot.snapshot_id, json.loads(props.get(IDS, "{}")))


def current_ledger(table: Any) -> Ledger:
    """The table's ledger: its property, or (a table from before the property) the newest snapshot summary in the
    current branch's ancestry that carries one; empty for a new table."""
    from pyiceberg.table.snapshots import ancestors_of

    current = table.current_snapshot()
    if LEDGER in table.properties:
        d = json.loads(table.properties[LEDGER])
        return Ledger({k: int(v) for k, v in d["ends"].items()}, {k: int(v) for k, v in d["starts"].items()},
                      dict(d["topics"]), current.snapshot_id if current is not None else None, dict(d.get("ids", {})))
    if current is None:
        return Ledger()
    for snap in ancestors_of(current, table.metadata):
        found = ledger_of(snap)
        if found is not None:
            return found
    return Ledger()


def snapshot_at(table: Any, topic: str, offsets: dict[int, int], topic_id: str | None = None) -> Any:
    """(the first snapshot (oldest in the current ancestry) whose table holds each given partition of `topic`'s
    incarnation `topic_id` (default: the current one) up to at least the given offset, i.e. every record below it,
    that id); (None, the id) when no snapshot does yet. Reading it with `offset < N` per partition (and the id, when
    the snapshot holds several incarnations of the topic: `Ledger.incarnations`) gives exactly those records.
    ValueError when `topic_id` is no incarnation of `topic` any snapshot's ledger records."""
    from pyiceberg.table.snapshots import ancestors_of

    current = table.current_snapshot()
    if current is None:
        return None, topic_id
    wanted = topic_id or current_ledger(table).topics.get(topic)  # None: a topic gone from the table
    chain = list(ancestors_of(current, table.metadata))[::-1]
    named = topic_id is None or topic_id in current_ledger(table).incarnations(topic)
    for snap in chain:
        led = ledger_of(snap)
        if led is None or topic not in led.topics:
            continue
        tid = wanted or led.topics[topic]
        if tid not in led.incarnations(topic):  # another topic's id, or one of this topic not held then
            continue
        named = True
        if all(led.ends.get(f"{tid}:{p}", -1) >= off for p, off in offsets.items()):
            return snap, tid
    if not named:
        held = ", ".join(current_ledger(table).incarnations(topic)) or "none"
        raise ValueError(f"--topic-id {topic_id}: not an incarnation of topic {topic} in table "
                         f"{'.'.join(table.name())}'s history (it holds {held})")
    return None, wanted
