"""The tier's compaction engine against a small model of Kafka's cleaner rules, written here from the rules
rather than from the engine's structure: no key map, no segments, no groups — the whole log at once.

Per key the record with the highest offset wins (records of aborted transactions never count); a tombstone stays
until the delete horizon its batch got when a cleaning first kept it (KIP-534); aborted records go; a marker goes
once no batch of its transaction is left and the horizon it then got has passed; each active producer's last data
batch (or, one holding none, its markers) and the log's last batch stay, empty if need be. A producer is active
unless idle producer.id.expiration.ms at the cleaning's time, and one idle that long at a batch's time (the newest
so far, at most the cleaning's) is a new producer from that batch on, as Kafka expires it. Histories are
generated, cleaned several times with time moving and new segments appended between cleanings; every cleaning must
give the model's batches exactly."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import compression
from protocol.records import ABORT, iter_batches
from tests.support.compaction import KEYS, PLAIN, Batch, History, Tier, latest_values
from tierproxy.tier.compaction import CleanerConfig

RETENTION = 100
EXPIRATION = 120  # producer.id.expiration.ms: rounds advance the clock 0-150 ms, so producers expire between them
IDEMPOTENT, TXN = 100, 200  # producer ids: idempotent producers 100-101, transactional 200-201


def active_producers(log: list[Batch], times: dict[int, int], now: int) -> dict[int, int | None]:
    """The producers active at `now` → the last offset of their last data batch (None: they hold none).
    `times`: a batch's base offset → its timestamp."""
    state: dict[int, tuple[int | None, int, bool]] = {}  # producer → last data offset, last time, in a transaction
    newest = None
    for b in log:
        newest = times[b.base] if newest is None else max(newest, times[b.base])
        if b.pid < 0:
            continue
        last, seen, in_txn = state.get(b.pid, (None, 0, False))
        if b.pid in state and not in_txn and min(newest, now) - seen >= EXPIRATION:
            last = None  # expired by then: a new producer from here on
        state[b.pid] = (last, times[b.base], False) if b.control is not None else \
            (b.last, times[b.base], in_txn or b.txn)
    return {pid: last for pid, (last, seen, in_txn) in state.items() if in_txn or now - seen < EXPIRATION}


def times_of(raw: bytes) -> dict[int, int]:
    """A raw log's batches: base offset → max timestamp (the time the engine's producer state reads)."""
    return {b.base_offset: b.header().max_timestamp for b in iter_batches(raw)}


def model_clean(log: list[Batch], now: int, times: dict[int, int]) -> list[Batch]:
    """One cleaning of the whole log by the rules."""
    aborted: set[int] = set()  # base offsets of aborted data batches
    txn_of_marker: dict[int, list[int]] = {}  # marker base → its transaction's data batches present
    open_txn: dict[int, list[int]] = {}
    for b in log:
        if b.control is not None:
            batches = open_txn.pop(b.pid, [])
            txn_of_marker[b.base] = batches
            if b.control == ABORT:
                aborted.update(batches)
        elif b.txn:
            open_txn.setdefault(b.pid, []).append(b.base)
    latest: dict[bytes | None, int] = {}
    active = active_producers(log, times, now)
    for b in log:
        if b.control is None and b.base not in aborted:
            for off, k, _ in b.records:
                latest[k] = max(latest.get(k, -1), off)
    log_end = log[-1].last
    out = []
    for b in log:
        if b.control is not None:
            can_discard = not txn_of_marker.get(b.base) or b.control == -1
            discard = can_discard and b.control != -1 and b.horizon is not None and b.horizon <= now
            if b.control == -1:
                discard = False
        else:
            can_discard = discard = b.base in aborted
        # an active producer's last data batch (or, one with none, its markers: one epoch here) and the log's last
        last_of_producer = b.pid in active and (active[b.pid] == b.last if active[b.pid] is not None
                                                else b.control is not None)
        retain_empty = last_of_producer or b.last == log_end
        if discard and not retain_empty:
            continue
        if discard:
            kept: tuple[tuple[int, bytes | None, bytes | None], ...] = ()
        elif b.control is not None:
            kept = b.records
        else:
            kept = tuple(r for r in b.records if latest[r[1]] == r[0]
                         and (r[2] is not None or b.horizon is None or now < b.horizon))
        if kept:
            tombstones = b.control is None and any(v is None for _, _, v in kept)
            need = (tombstones or (can_discard and b.control is not None)) and b.horizon is None
            out.append(dataclasses.replace(b, records=kept, horizon=now + RETENTION if need else b.horizon))
        elif retain_empty:
            out.append(dataclasses.replace(b, records=(), horizon=None,
                                           control=-1 if b.control is not None else None))
    return out


# one step of a history: ("put", producer, [(key index, value or None)], codec) or ("txn", producer, n, commit)
step = st.one_of(
    st.tuples(st.just("put"), st.sampled_from([PLAIN, IDEMPOTENT, IDEMPOTENT + 1]),
              st.lists(st.tuples(st.integers(0, len(KEYS) - 1), st.booleans()), min_size=1, max_size=3),
              st.sampled_from([compression.NONE, compression.NONE, compression.GZIP])),
    st.tuples(st.just("txn"), st.sampled_from([TXN, TXN + 1]), st.integers(0, 3), st.booleans()),
)
rounds = st.lists(st.tuples(st.lists(step, min_size=1, max_size=8), st.integers(0, 3 * RETENTION // 2),
                            st.integers(1, 3)), min_size=1, max_size=4)


def _split(batches: list[bytes], parts: int) -> list[list[bytes]]:
    size = max(1, -(-len(batches) // parts))
    return [batches[i:i + size] for i in range(0, len(batches), size)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rounds)
def test_engine_cleans_as_the_model_over_several_cleanings(history: list) -> None:  # type: ignore[type-arg]
    config = CleanerConfig(delete_retention_ms=RETENTION, min_cleanable_dirty_ratio=0.0,
                           producer_id_expiration_ms=EXPIRATION)
    tier, h, now = Tier(config), History(), 1_000
    model: list[Batch] = []
    times: dict[int, int] = {}
    for steps, advance, parts in history:
        batches = h.chunk(steps, now)
        for seg in _split(batches, parts):
            tier.append(seg)
        model += tier.batches()[len(model):]  # the appended raw batches, decoded
        times.update(times_of(b"".join(batches)))
        now += advance
        out = tier.clean(now)
        assert out is not None  # dirty bytes > 0 and a ratio of 0: always due
        expected = model_clean(model, now, times)
        assert tier.batches() == expected
        assert latest_values(tier.batches()) == latest_values(expected)
        model = expected
        for c in out:
            assert c.start_offset <= c.end_offset and (c.files is None or c.files.start_offset >= c.start_offset)
