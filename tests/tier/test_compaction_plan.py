"""When a cleaning is due and what it covers, as Kafka's LogCleanerManager decides: min.cleanable.dirty.ratio
(strictly above), min.compaction.lag.ms (young segments wait), max.compaction.lag.ms (due whatever the ratio),
the last stable offset, segment.bytes grouping; and the topic configs read with Kafka's names and defaults."""

from __future__ import annotations

import pytest

from tierproxy.config.propfile import ConfigError
from tierproxy.tier.compaction import CleanerConfig, TierSegment, plan_cleaning

NOW = 1_000_000


def _seg(start: int, end: int, size: int, *, cleaned: bool = False, ts: int = NOW - 10_000,
         first_ts: int | None = None) -> TierSegment:
    return TierSegment(start.to_bytes(16, "big"), start, end, ts, size, cleaned, first_ts)


def test_due_only_when_the_dirty_ratio_is_above_the_setting() -> None:
    segs = [_seg(0, 99, 600, cleaned=True), _seg(100, 199, 400)]  # ratio 0.4
    assert plan_cleaning(segs, NOW, CleanerConfig(min_cleanable_dirty_ratio=0.5)) is None
    assert plan_cleaning(segs, NOW, CleanerConfig(min_cleanable_dirty_ratio=0.4)) is None  # strictly above
    plan = plan_cleaning(segs, NOW, CleanerConfig(min_cleanable_dirty_ratio=0.39))
    assert plan is not None and plan.dirty_ratio == pytest.approx(0.4) and not plan.forced_by_max_lag
    assert plan.first_dirty_offset == 100 and plan.first_uncleanable_offset == 200
    assert plan.segments == tuple(segs)  # the clean prefix is recopied too
    assert plan_cleaning([_seg(0, 99, 600, cleaned=True)], NOW, CleanerConfig(min_cleanable_dirty_ratio=0)) is None


def test_min_compaction_lag_keeps_young_segments_out() -> None:
    segs = [_seg(0, 99, 100, ts=NOW - 5_000), _seg(100, 199, 100, ts=NOW - 500), _seg(200, 299, 100, ts=NOW - 9_000)]
    plan = plan_cleaning(segs, NOW, CleanerConfig(min_compaction_lag_ms=1_000, min_cleanable_dirty_ratio=0))
    assert plan is not None and plan.first_uncleanable_offset == 100  # the first young segment stops it
    assert plan.segments == (segs[0],) and plan.later == tuple(segs[1:])
    assert plan_cleaning(segs, NOW, CleanerConfig(min_compaction_lag_ms=6_000, min_cleanable_dirty_ratio=0)) is None


def test_max_compaction_lag_makes_a_cleaning_due_below_the_ratio() -> None:
    segs = [_seg(0, 99, 900, cleaned=True), _seg(100, 199, 100, first_ts=NOW - 60_000)]  # ratio 0.1
    assert plan_cleaning(segs, NOW, CleanerConfig(max_compaction_lag_ms=120_000)) is None
    plan = plan_cleaning(segs, NOW, CleanerConfig(max_compaction_lag_ms=30_000))
    assert plan is not None and plan.forced_by_max_lag
    # without the first batch's timestamp the segment's max timestamp stands in: never earlier than Kafka
    late = [segs[0], _seg(100, 199, 100, ts=NOW - 20_000)]
    assert plan_cleaning(late, NOW, CleanerConfig(max_compaction_lag_ms=30_000)) is None


def test_the_last_stable_offset_bounds_the_cleaning_at_a_segment_start() -> None:
    segs = [_seg(0, 99, 100), _seg(100, 199, 100), _seg(200, 299, 100)]
    plan = plan_cleaning(segs, NOW, CleanerConfig(min_cleanable_dirty_ratio=0), last_stable_offset=150)
    assert plan is not None and plan.first_uncleanable_offset == 100 and plan.segments == (segs[0],)
    assert plan_cleaning(segs, NOW, CleanerConfig(min_cleanable_dirty_ratio=0), last_stable_offset=50) is None


def test_segments_are_grouped_up_to_segment_bytes() -> None:
    segs = [_seg(i * 100, i * 100 + 99, 400) for i in range(5)]
    plan = plan_cleaning(segs, NOW, CleanerConfig(min_cleanable_dirty_ratio=0, segment_bytes=1_000))
    assert plan is not None and [len(g) for g in plan.groups] == [2, 2, 1]


def test_topic_configs_with_kafkas_names_and_defaults() -> None:
    assert CleanerConfig.from_topic_configs({}) == CleanerConfig()
    c = CleanerConfig.from_topic_configs({"delete.retention.ms": "5", "min.compaction.lag.ms": "6",
                                          "max.compaction.lag.ms": "7", "min.cleanable.dirty.ratio": "0.25",
                                          "segment.bytes": "1048576", "cleanup.policy": "compact"})
    assert c == CleanerConfig(5, 6, 7, 0.25, 1 << 20)
    with pytest.raises(ConfigError, match=r"min.cleanable.dirty.ratio='1.5': must be between 0 and 1"):
        CleanerConfig.from_topic_configs({"min.cleanable.dirty.ratio": "1.5"})
    with pytest.raises(ConfigError, match=r"delete.retention.ms='soon': not an integer"):
        CleanerConfig.from_topic_configs({"delete.retention.ms": "soon"})
