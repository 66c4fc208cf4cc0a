"""KIP-405's data model: topic-id partitions, remote segment ids, segment metadata and its state machine."""

from __future__ import annotations

import base64
import enum
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, fields, replace
from itertools import chain


def uuid_str(raw: bytes) -> str:
    """Kafka's textual Uuid: URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def uuid_bytes(text: str) -> bytes:
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if len(raw) != 16:
        raise ValueError(f"not a Kafka Uuid: {text!r}")
    return raw


def new_uuid() -> bytes:
    return uuid.uuid4().bytes


@dataclass(frozen=True, slots=True)
class TopicIdPartition:
    topic: str
    topic_id: bytes
    partition: int

    def __str__(self) -> str:  # Kafka's TopicIdPartition.toString(), used for metadata partitioning
        return f"{uuid_str(self.topic_id)}:{self.topic}-{self.partition}"


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentId:
    tp: TopicIdPartition
    id: bytes

    def __str__(self) -> str:
        return f"{self.tp}/{uuid_str(self.id)}"


class SegmentState(enum.IntEnum):
    COPY_SEGMENT_STARTED = 0
    COPY_SEGMENT_FINISHED = 1
    DELETE_SEGMENT_STARTED = 2
    DELETE_SEGMENT_FINISHED = 3


class PartitionDeleteState(enum.IntEnum):
    DELETE_PARTITION_MARKED = 0
    DELETE_PARTITION_STARTED = 1
    DELETE_PARTITION_FINISHED = 2


_SEGMENT_TRANSITIONS = {
    SegmentState.COPY_SEGMENT_STARTED: {SegmentState.COPY_SEGMENT_FINISHED, SegmentState.DELETE_SEGMENT_STARTED},
    SegmentState.COPY_SEGMENT_FINISHED: {SegmentState.DELETE_SEGMENT_STARTED},
    SegmentState.DELETE_SEGMENT_STARTED: {SegmentState.DELETE_SEGMENT_STARTED, SegmentState.DELETE_SEGMENT_FINISHED},
    SegmentState.DELETE_SEGMENT_FINISHED: set(),
}
_PARTITION_TRANSITIONS = {
    None: {PartitionDeleteState.DELETE_PARTITION_MARKED},
    PartitionDeleteState.DELETE_PARTITION_MARKED: {PartitionDeleteState.DELETE_PARTITION_MARKED,
                                                   PartitionDeleteState.DELETE_PARTITION_STARTED},
    PartitionDeleteState.DELETE_PARTITION_STARTED: {PartitionDeleteState.DELETE_PARTITION_STARTED,
                                                    PartitionDeleteState.DELETE_PARTITION_FINISHED},
    PartitionDeleteState.DELETE_PARTITION_FINISHED: set(),
}


class IllegalStateTransition(ValueError):
    """A lifecycle event that the KIP-405 state machine does not allow."""


def check_segment_transition(current: SegmentState | None, target: SegmentState, what: object) -> None:
    if current is None:
        if target != SegmentState.COPY_SEGMENT_STARTED:
            raise IllegalStateTransition(f"{what}: unknown segment cannot move to {target.name} "
                                         "(the first event must be COPY_SEGMENT_STARTED)")
        return
    if target not in _SEGMENT_TRANSITIONS[current]:
        raise IllegalStateTransition(f"{what}: illegal transition {current.name} -> {target.name}")


def check_partition_transition(current: PartitionDeleteState | None, target: PartitionDeleteState,
                               what: object) -> None:
    if target not in _PARTITION_TRANSITIONS[current]:
        raise IllegalStateTransition(f"{what}: illegal transition {current.name if current is not None else 'none'}"
                                     f" -> {target.name}")


class LeaderEpochs(Mapping[int, int]):
    """A segment's leader epochs, epoch → the first offset of that epoch in the segment, read-only and kept as one
    flat tuple (epoch, offset, epoch, offset, ...): under half a dict's memory, a million times over in a view of
    a large tier. Equal to any mapping of the same pairs; in the order given."""

    __slots__ = ("_flat",)

    def __init__(self, pairs: Mapping[int, int] | Iterable[tuple[int, int]] = ()) -> None:
        self._flat: tuple[int, ...] = tuple(chain.from_iterable((pairs if isinstance(pairs, dict) else
                                                                 dict(pairs)).items()))

    @classmethod
    def of_flat(cls, flat: tuple[int, ...]) -> LeaderEpochs:
        """From (epoch, offset, epoch, offset, ...) as read, epochs distinct (a record reader's fast path)."""
        made = cls.__new__(cls)
        made._flat = flat
        return made

    def pairs(self) -> list[tuple[int, int]]:
        """(epoch, offset) in the order given: `items()` without a look-up per key."""
        return list(zip(self._flat[0::2], self._flat[1::2], strict=True))

    def __getitem__(self, epoch: int) -> int:
        flat = self._flat
        for i in range(0, len(flat), 2):
            if flat[i] == epoch:
                return flat[i + 1]
        raise KeyError(epoch)

    def __iter__(self) -> Iterator[int]:
        return iter(self._flat[0::2])

    def __len__(self) -> int:
        return len(self._flat) // 2

    def __repr__(self) -> str:
        return f"LeaderEpochs({dict(self)!r})"


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentMetadata:
    """One remote segment: offsets, timestamps, the leader epochs it spans (epoch → start offset), size, state."""

    segment_id: RemoteLogSegmentId
    start_offset: int
    end_offset: int
    max_timestamp_ms: int
    broker_id: int
    event_timestamp_ms: int
    segment_leader_epochs: Mapping[int, int]  # a LeaderEpochs once made (any mapping given is turned into one)
    segment_size_in_bytes: int
    state: SegmentState = SegmentState.COPY_SEGMENT_STARTED
    txn_index_empty: bool = False
    custom_metadata: bytes | None = None
    broker_leader_epoch: int = 0  # the writer's leader epoch (compacted-metadata KIP key component)

    def __post_init__(self) -> None:
        if self.start_offset < 0 or self.end_offset < self.start_offset:
            raise ValueError(f"bad offsets {self.start_offset}..{self.end_offset}")
        if not self.segment_leader_epochs:
            raise ValueError("segment_leader_epochs must not be empty")
        if not isinstance(self.segment_leader_epochs, LeaderEpochs):
            object.__setattr__(self, "segment_leader_epochs", LeaderEpochs(self.segment_leader_epochs))

    @classmethod
    def of_read(cls, segment_id: RemoteLogSegmentId, start_offset: int, end_offset: int, max_timestamp_ms: int,
                broker_id: int, event_timestamp_ms: int, segment_leader_epochs: LeaderEpochs,
                segment_size_in_bytes: int, state: SegmentState, txn_index_empty: bool,
                custom_metadata: bytes | None, broker_leader_epoch: int) -> RemoteLogSegmentMetadata:
        """The same as the constructor, for a record reader's fast path: its slots set directly (a frozen
        dataclass's `__init__` sets each through `object.__setattr__`, a third of reading a segment record)."""
        if start_offset < 0 or end_offset < start_offset:
            raise ValueError(f"bad offsets {start_offset}..{end_offset}")
        if not segment_leader_epochs:
            raise ValueError("segment_leader_epochs must not be empty")
        md = object.__new__(cls)
        _SET_SEGMENT_ID(md, segment_id)
        _SET_START(md, start_offset)
        _SET_END(md, end_offset)
        _SET_MAX_TS(md, max_timestamp_ms)
        _SET_BROKER(md, broker_id)
        _SET_EVENT_TS(md, event_timestamp_ms)
        _SET_EPOCHS(md, segment_leader_epochs)
        _SET_SIZE(md, segment_size_in_bytes)
        _SET_STATE(md, state)
        _SET_TXN_EMPTY(md, txn_index_empty)
        _SET_CUSTOM(md, custom_metadata)
        _SET_BLE(md, broker_leader_epoch)
        return md

    @property
    def tp(self) -> TopicIdPartition:
        return self.segment_id.tp

    @property
    def leader_epoch(self) -> int:
        """The highest leader epoch in the segment."""
        return max(self.segment_leader_epochs)

    def with_update(self, update: RemoteLogSegmentMetadataUpdate) -> RemoteLogSegmentMetadata:
        return replace(self, state=update.state, event_timestamp_ms=update.event_timestamp_ms,
                       broker_id=update.broker_id,
                       custom_metadata=update.custom_metadata if update.custom_metadata is not None
                       else self.custom_metadata,
                       broker_leader_epoch=update.broker_leader_epoch)

    def epoch_ranges(self) -> list[tuple[int, int, int]]:
        """(epoch, first offset, last offset) for each leader epoch in the segment."""
        epochs = self.segment_leader_epochs
        if isinstance(epochs, LeaderEpochs) and len(epochs._flat) == 2:  # one epoch: the usual segment
            return [(epochs._flat[0], epochs._flat[1], self.end_offset)]
        items = sorted(epochs.pairs() if isinstance(epochs, LeaderEpochs) else epochs.items(), key=lambda kv: kv[1])
        out = []
        for i, (epoch, start) in enumerate(items):
            end = items[i + 1][1] - 1 if i + 1 < len(items) else self.end_offset
            out.append((epoch, start, end))
        return out


(_SET_SEGMENT_ID, _SET_START, _SET_END, _SET_MAX_TS, _SET_BROKER, _SET_EVENT_TS, _SET_EPOCHS, _SET_SIZE, _SET_STATE,
 _SET_TXN_EMPTY, _SET_CUSTOM, _SET_BLE) = (getattr(RemoteLogSegmentMetadata, f.name).__set__
                                          for f in fields(RemoteLogSegmentMetadata))


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentMetadataUpdate:
    segment_id: RemoteLogSegmentId
    event_timestamp_ms: int
    state: SegmentState
    broker_id: int
    custom_metadata: bytes | None = None
    broker_leader_epoch: int = 0
    end_offset: int = -1  # carried for the compacted topic's key (tagged in v1)


@dataclass(frozen=True, slots=True)
class RemotePartitionDeleteMetadata:
    tp: TopicIdPartition
    state: PartitionDeleteState
    event_timestamp_ms: int
    broker_id: int
    broker_leader_epoch: int = 0
    end_offset: int = -1


@dataclass(frozen=True, slots=True)
class RemoteLogStartOffset:
    """The partition's log start offset moved by a purge (DeleteRecords), not by retention: the tier serves
    nothing below it and deletes the segments wholly below it (Kafka's `isSegmentBreachByLogStartOffset`)."""
    tp: TopicIdPartition
    log_start_offset: int
    event_timestamp_ms: int
    broker_id: int = -1


class PassStage(enum.IntEnum):
    """Where a requested pass stands, on the record under the "done" key: FINISHED (the pass that served it ran;
    records written before the stage existed read as this), TAKEN (a tier job started it), WITHDRAWN (its asker
    gave up before a job took it)."""
    FINISHED = 0
    TAKEN = 1
    WITHDRAWN = 2


@dataclass(frozen=True, slots=True)
class TierPass:
    """A tiering pass asked for (`requested`: the admin API's trigger, which the running tier job picks up until
    `expires_ms`, -1 never) or what became of it (`requested` False: its `stage`; once FINISHED, the summary line
    and exit code of the pass that served the request `request_id`)."""
    request_id: str
    requested: bool
    event_timestamp_ms: int
    summary: str | None = None
    returncode: int = 0
    expires_ms: int = -1
    stage: PassStage = PassStage.FINISHED


class TxnOutcome(enum.IntEnum):
    ABORTED = 0
    COMMITTED = 1
    # undecided when recorded; a restore resolves it (`tier.transactions.resolve_lost`). This version's pass never
    # writes it: a copy reads below the last stable offset, where every transaction is decided
    OPEN = 2


@dataclass(frozen=True, slots=True)
class TransactionOutcome:
    """The outcome of a transaction whose records the tier holds but whose marker lies above what it holds (open
    at a tiered segment's end), as it was learnt (`learnt`: where from). ABORTED and COMMITTED are final: readers
    take them before any cluster's log, which after a restore knows nothing of the transaction."""
    tp: TopicIdPartition
    producer_id: int
    first_offset: int
    outcome: TxnOutcome
    learnt: str
    event_timestamp_ms: int

    @property
    def decided(self) -> bool:
        return self.outcome != TxnOutcome.OPEN


NO_ALIAS = bytes(16)


@dataclass(frozen=True, slots=True)
class TopicMount:
    """A topic id the tier holds from a cluster that is gone (`origin_cluster`), as a restore handed it to the
    cluster that now owns the tier (`owner_cluster`). `alias_id` is the restored topic's id there: its history
    continues as one log under `origin_id`. NO_ALIAS: the topic was not restored; its history is kept, and the new
    owner can never prove it deleted (it never had that id)."""
    topic: str
    origin_id: bytes
    alias_id: bytes
    origin_cluster: str
    owner_cluster: str
    event_timestamp_ms: int

    @property
    def mounted(self) -> bool:
        return self.alias_id != NO_ALIAS
