"""Property: whatever the key map's size, the grouping and where transactions are undecided, cleaning after
cleaning ends with what Kafka's rules give for the whole raw log — the same live value of every key.

Histories from the model test, cut into segments; after each round the tier may end inside a transaction
whose marker comes with the next round (the broker's LSO is past it, the tier does not hold it yet); each round
is cleaned until clean with a map of a few keys and small groups, so maps fill inside groups and segments."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.records import ABORT, COMMIT
from tests.support.compaction import History, Tier, decode, latest_values
from tests.tier.test_compaction_model import RETENTION, _split, model_clean, rounds, times_of
from tierproxy.tier.compaction import BYTES_PER_ENTRY, CleanerConfig

OPEN = 300  # the producer of the transactions left open at a round's end
opens = st.lists(st.tuples(st.booleans(), st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=1,
                                                   max_size=3), st.booleans()), min_size=4, max_size=4)


def _clean_until_clean(tier: Tier, now: int, map_bytes: int) -> None:
    """Clean until nothing is dirty or the cleaned point stops moving (an undecided transaction holds it)."""
    cleaned_to = -1
    for _ in range(50):
        out = tier.clean(now, map_bytes=map_bytes)
        reached = max((s.end_offset for s, _ in tier.segments if s.cleaned), default=-1)
        if out is None or reached == cleaned_to or all(s.cleaned for s, _ in tier.segments):
            return
        cleaned_to = reached
    raise AssertionError("the cleanings do not converge")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rounds, opens, st.integers(3, 8), st.integers(100, 3000))
def test_small_maps_and_undecided_transactions_end_as_the_rules(history: list, opens: list,  # type: ignore[type-arg]
                                                                map_keys: int, segment_bytes: int) -> None:
    config = CleanerConfig(delete_retention_ms=RETENTION, min_cleanable_dirty_ratio=0.0, segment_bytes=segment_bytes)
    map_bytes = BYTES_PER_ENTRY * (map_keys * 10 // 9 + 2)  # room for map_keys keys (one batch holds up to 3)
    tier, h, now = Tier(config), History(), 1_000
    raw: list[bytes] = []
    pending: bool | None = None  # the open transaction's outcome, once its marker comes
    for (steps, advance, parts), (leave_open, ops, commit) in zip(history, opens, strict=False):
        batches = [h.marker(OPEN, COMMIT if pending else ABORT, now)] if pending is not None else []
        batches += h.chunk(steps, now)
        pending = None
        if leave_open:
            batches.append(h.data(OPEN, ops, now, txn=True))
            pending = commit
        raw += batches
        for seg in _split(batches, parts):
            tier.append(seg)
        now += advance
        _clean_until_clean(tier, now, map_bytes)
    if pending is not None:
        raw.append(h.marker(OPEN, COMMIT if pending else ABORT, now))
        tier.append(raw[-1:])
        _clean_until_clean(tier, now, map_bytes)
    expected = latest_values(model_clean(decode(b"".join(raw)), now, times_of(b"".join(raw))))
    # tombstones go once their horizon passed, at different cleanings on each side: the live values must agree
    assert {k: v for k, v in latest_values(tier.batches()).items() if v[1] is not None} == \
        {k: v for k, v in expected.items() if v[1] is not None}
