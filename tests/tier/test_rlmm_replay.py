"""The RLMM describes the same tier after compaction, or after a checkpoint restart, as after a full replay.

Random tiering passes drive the real RLMM writes (`add_segments`, `finish_copy`, the deletions the tier job
makes) with the job's own rule for what a copy holds: the whole batches whose base offset lies in the planned
range, plus, for a partition's first range of a pass, the batch straddling its start. So batches cross range
boundaries, ranges come back empty, copies fail and are discarded, retention deletes the oldest segments. After
every pass three readers must agree with the writer's live view: one replaying every record, one replaying what
compaction keeps (the last value of each key, tombstoned keys dropped, in log order), and one restarted from the
topic RLMM's real checkpoint file.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.segments import Partition, one_pass, tp
from tierproxy.tier.model import SegmentState, TopicIdPartition
from tierproxy.tier.rlmm import RemoteLogMetadataManager, ReplayedMetadata
from tierproxy.tier.rlmm_topic import TopicRLMM
from tierproxy.tier.serde import metadata_partition

S = SegmentState
Record = tuple[bytes, bytes | None]


class LogRLMM(RemoteLogMetadataManager):
    """The writer: its records appended to one ordered log (what one metadata partition holds)."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[Record] = []

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def catch_up(self) -> None: ...

    async def publish(self, records: list[Record]) -> None:
        for key, value in records:
            self.log.append((key, value))
            self.apply_record(key, value)


class ReplayRLMM(LogRLMM):
    """A reader that applies a given log."""

    def __init__(self, records: list[Record]) -> None:
        super().__init__()
        for key, value in records:
            self.apply_record(key, value)


def compacted(log: list[Record]) -> list[Record]:
    """What the log cleaner keeps: each key's last record at its position; a key whose last record is a
    tombstone is gone (after delete.retention.ms)."""
    last = {key: i for i, (key, _) in enumerate(log)}
    return [(k, v) for i, (k, v) in enumerate(log) if last[k] == i and v is not None]


def view(r: RemoteLogMetadataManager) -> dict[bytes, tuple[int, int, int, bool]]:
    """Every segment a reader knows: (start, end, state, served)."""
    out = {}
    for pc in r.cache.partitions.values():
        served = {md.segment_id.id for md in pc.finished()}
        for md in pc.segments.values():
            out[md.segment_id.id] = (md.start_offset, md.end_offset, int(md.state), md.segment_id.id in served)
    return out


def restarted(log: list[Record], t: TopicIdPartition, directory: Path) -> TopicRLMM:
    """A topic RLMM that consumed `log`, wrote its checkpoint, and a new one loaded from that checkpoint."""
    before = TopicRLMM("127.0.0.1:1", partitions=1, checkpoint_dir=directory)
    part = metadata_partition(t, 1)
    for offset, (key, value) in enumerate(log):
        before._apply(part, offset, key, value)
    before.positions[part] = len(log)
    before.write_checkpoint()
    after = TopicRLMM("127.0.0.1:1", partitions=1, checkpoint_dir=directory)
    assert after.load_checkpoint() == {part: len(log)}
    return after


passes = st.lists(st.tuples(st.integers(1, 40), st.sets(st.integers(0, 6), max_size=2), st.integers(0, 1)),
                  min_size=1, max_size=10)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch_sizes=st.lists(st.integers(1, 30), min_size=1, max_size=12), growth=st.integers(1, 40),
       passes=passes)
def test_compaction_and_checkpoint_describe_the_same_tier_as_a_full_replay(
        tmp_path: Path, batch_sizes: list[int], growth: int, passes: list[tuple[int, set[int], int]]) -> None:
    async def go() -> None:
        t = tp("replayed")
        r = LogRLMM()
        sizes = list(batch_sizes)
        middle = len(passes) // 2
        for n, (per, failing, expire) in enumerate(passes):
            await one_pass(r, t, Partition(sizes), per, failing, expire)
            if n == middle:  # compacted once in the middle, then the records after it
                cut, before = len(r.log), view(r)
                assert view(ReplayRLMM(compacted(r.log))) == before, f"pass {n}: compacted"
            sizes += [growth % 29 + 1] * (1 + n % 3)  # the log grows between passes
        live = view(r)
        assert view(ReplayRLMM(r.log)) == live, "full replay"
        assert view(ReplayRLMM(compacted(r.log))) == live, "compacted"
        assert view(ReplayRLMM(compacted(r.log[:cut]) + r.log[cut:])) == live, "compacted, then the tail"
        assert view(restarted(r.log, t, tmp_path / "cp")) == live, "checkpoint restart"
        assert view(ReplayedMetadata.of(r.live_records())) == live, "a tier snapshot's records"
        replayed = ReplayRLMM(r.log)  # its live keys made from its records when first asked, as kept by a writer
        assert replayed._keys is None and replayed.keys == {pk: ks for pk, ks in r.keys.items() if ks}

    asyncio.run(go())


def test_an_empty_last_range_does_not_take_the_copied_segment_with_it(tmp_path: Path) -> None:
    """The finding, by hand: a pass plans [0, 100) and [100, 106); the batch 95..105 crosses the boundary, so the
    first copy ends at 105 and the second comes back empty. Its planned end, 105, is the first copy's real end."""
    async def go() -> None:
        t = tp("crossing")
        r = LogRLMM()
        await one_pass(r, t, Partition([95, 11]), 100, set(), 0)
        (seg,) = view(r).values()
        assert seg == (0, 105, int(S.COPY_SEGMENT_FINISHED), True)
        assert view(ReplayRLMM(compacted(r.log))) == view(r)
        assert view(restarted(r.log, t, tmp_path)) == view(r)

    asyncio.run(go())


def test_a_checkpoint_of_the_older_format_is_read_as_none_and_replaced(tmp_path: Path) -> None:
    """Format 1 (a file per metadata partition) is not read: the view reads the topic whole instead, and the next
    checkpoint (one file) removes the old files. A checkpoint cut short is not read either."""
    old = tmp_path / "__tierproxy_remote_log_metadata-0.checkpoint"
    old.write_bytes(b"\x01\x02")
    view = TopicRLMM("127.0.0.1:1", partitions=1, checkpoint_dir=tmp_path)
    assert view.load_checkpoint() == {}
    view.apply_record(*_one_record())
    view.positions[0] = 7
    view.write_checkpoint()
    assert [p.name for p in tmp_path.iterdir()] == ["__tierproxy_remote_log_metadata.checkpoint"]
    again = TopicRLMM("127.0.0.1:1", partitions=1, checkpoint_dir=tmp_path)
    assert again.load_checkpoint() == {0: 7} and again.values == view.values
    whole = (tmp_path / "__tierproxy_remote_log_metadata.checkpoint").read_bytes()
    (tmp_path / "__tierproxy_remote_log_metadata.checkpoint").write_bytes(whole[:-3])
    cut = TopicRLMM("127.0.0.1:1", partitions=1, checkpoint_dir=tmp_path)
    assert cut.load_checkpoint() == {} and cut.values == {}


def _one_record() -> tuple[bytes, bytes]:
    from tests.support.segments import seg
    from tierproxy.tier.serde import encode_value, record_key

    md = seg(tp("orders", 0), 0, 9)
    return record_key(md), encode_value(md)
