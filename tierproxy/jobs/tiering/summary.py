"""One tiering pass's summary: what `tier --once` prints, exits with and keeps in `last_run.json`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tierproxy.jobs.tiering.compact import CompactionSummary
from tierproxy.tier.requests import describe


@dataclass
class RunSummary:
    run_id: str
    started_ms: int
    seconds: float = 0.0
    segments: int = 0
    bytes: int = 0
    failed: int = 0
    orphans_cleaned: int = 0
    expired: int = 0
    purged: int = 0  # segments deleted wholly below a recorded purge (DeleteRecords through a proxy)
    retention_refused: list[str] = field(default_factory=list)  # tier retention that would delete too much at once
    partitions_deleted: int = 0
    topics_pending_deletion: list[str] = field(default_factory=list)  # proven gone, within the delete delay
    gaps: list[dict[str, Any]] = field(default_factory=list)
    # compacted partitions whose copies found records the cleaner removed more than delete.retention.ms after the
    # tier's newest record: a tombstone among them may be gone (`rules.tombstones_at_risk`)
    tombstone_risks: list[str] = field(default_factory=list)
    lag: dict[str, int] = field(default_factory=dict)  # "topic-partition" → offsets below the LSO not tiered
    errors: list[str] = field(default_factory=list)
    recopied: int = 0  # segments whose file:// tier file was short, copied again (once per job, at its first pass)
    snapshot: str = ""  # the tier snapshot this pass wrote (`tier.snapshot`: what a restore reads)
    storage: dict[str, Any] = field(default_factory=dict)  # object-store requests and bytes of the pass: the
    # driver's and every copy task's (`tier.requests`)
    retired: int = 0  # segments a replacement took the place of, marked for deletion (`tiering.replace`)
    retired_deleted: int = 0  # segments marked for deletion tier.segment.delete.delay.ms ago, deleted
    compaction: dict[str, Any] = field(default_factory=dict)  # the compaction step (`compact.CompactionSummary`)

    @property
    def exit_code(self) -> int:
        """What `tier --once` exits with after this pass: 1 when copies failed and none succeeded, 5 when a
        deletion was refused by the guard, else 0."""
        if self.failed and self.segments == 0:
            return 1
        return 5 if self.retention_refused else 0

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds else 0.0

    def line(self) -> str:
        return (f"tiered {self.segments} segments, {self.bytes / 1e6:.1f} MB in {self.seconds:.1f}s "
                f"({self.mb_per_s:.1f} MB/s); lag to LSO {sum(self.lag.values())} offsets; "
                f"{len(self.gaps)} gaps; {self.expired} expired; {self.purged} purged; "
                f"{len(self.retention_refused)} retention refused; {self.orphans_cleaned} orphans cleaned; "
                f"{self.partitions_deleted} partitions deleted; {len(self.topics_pending_deletion)} deleted topics "
                f"within the delete delay; {self.failed} failed copies"
                + (f"; {CompactionSummary(**self.compaction).line()}" if self.compaction.get("partitions") else "")
                + (f"; {describe(self.storage)}" if any(self.storage.get("requests", {}).values()) else ""))
