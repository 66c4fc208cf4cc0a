"""The DataFrame reader's options, named as Spark's Kafka source names them, parsed and checked on the driver.

    subscribe | subscribePattern | assign       which topic partitions (exactly one of the three)
    startingOffsets / endingOffsets             "earliest" / "latest" / {"topic": {"0": 23, "1": -2}} (-2 earliest,
                                                -1 latest)
    startingTimestamp / endingTimestamp         one timestamp (ms) for every partition
    startingOffsetsByTimestamp / endingOffsetsByTimestamp   {"topic": {"0": ms}}
    startingOffsetsByTimestampStrategy          "error" (default) or "latest" when no record is that new
    includeHeaders                              false (default): no `headers` column
    kafka.isolation.level                       read_uncommitted (default, as Spark's Kafka source) | read_committed
    failOnDataLoss                              true (default): a hole in the range (tier or broker) is an error
    kafka.bootstrap.servers                     the cluster: topic ids, leaders, the metadata topic, the live range
    storage, metadata                           the tier, same URIs and defaults as `tierproxy tier`
    includeLive                                 false (default): the tier only; true: continue into the brokers'
                                                live range, one DataFrame with every offset exactly once
    maxBytesPerPartition                        the most segment bytes one input partition reads (128 MiB, as
                                                Spark's spark.sql.files.maxPartitionBytes): small segments are
                                                packed together, large ones cut into byte ranges
    minPartitions                               at least this many input partitions when the data allows (as
                                                Spark's Kafka source; default: none)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

from protocol import constants

# Spark's offset JSON uses Kafka's ListOffsets sentinels
EARLIEST, LATEST = constants.OffsetSpec.EARLIEST, constants.OffsetSpec.LATEST
# Spark's file sources' default (spark.sql.files.maxPartitionBytes): each Spark task costs ~0.1 s of fixed time on top
# of its rows (measured: an empty Python data source task), so 32 MiB tasks spent a third of their time on it
MAX_BYTES_PER_PARTITION = 128 << 20
OffsetSpec = Literal["earliest", "latest"] | dict[tuple[str, int], int]

_KNOWN = {"subscribe", "subscribepattern", "assign", "startingoffsets", "endingoffsets", "startingtimestamp",
          "endingtimestamp", "startingoffsetsbytimestamp", "endingoffsetsbytimestamp",
          "startingoffsetsbytimestampstrategy", "includeheaders", "kafka.isolation.level", "failondataloss",
          "kafka.bootstrap.servers", "storage", "metadata", "includelive", "maxbytesperpartition", "minpartitions",
          "path"}


class OptionError(ValueError):
    """An option is missing, unknown or malformed; the message names it."""


@dataclass(frozen=True)
class ReadOptions:
    bootstrap: str
    storage: str
    metadata: str | None = None
    subscribe: tuple[str, ...] = ()
    pattern: str | None = None
    assign: dict[str, list[int]] | None = None
    starting: OffsetSpec = "earliest"
    ending: OffsetSpec = "latest"
    starting_ts: dict[tuple[str, int], int] | int | None = None
    ending_ts: dict[tuple[str, int], int] | int | None = None
    ts_strategy: str = "error"
    include_headers: bool = False
    read_committed: bool = False
    fail_on_data_loss: bool = True
    include_live: bool = False
    max_bytes_per_partition: int = MAX_BYTES_PER_PARTITION
    min_partitions: int | None = None
    extra: dict[str, str] = field(default_factory=dict)


def parse_options(raw: dict[str, str]) -> ReadOptions:
    """Options as Spark hands them to the data source (keys compared case-insensitively)."""
    opts = {k.lower(): v for k, v in raw.items()}
    unknown = sorted(k for k in opts if k not in _KNOWN)
    if unknown:
        raise OptionError(f"unknown option {unknown[0]!r} (kafka.* client settings other than "
                          "kafka.bootstrap.servers and kafka.isolation.level are not supported yet)")
    if not opts.get("kafka.bootstrap.servers"):
        raise OptionError("option 'kafka.bootstrap.servers' is required")
    if not opts.get("storage"):
        raise OptionError("option 'storage' is required (file:///path or s3://bucket/prefix?endpoint=...)")
    chosen = [k for k in ("subscribe", "subscribepattern", "assign") if opts.get(k)]
    if len(chosen) != 1:
        raise OptionError("exactly one of 'subscribe', 'subscribePattern' or 'assign' is required")
    isolation = opts.get("kafka.isolation.level", "read_uncommitted")
    if isolation not in ("read_uncommitted", "read_committed"):
        raise OptionError(f"option 'kafka.isolation.level': {isolation!r} is not read_uncommitted or read_committed")
    strategy = opts.get("startingoffsetsbytimestampstrategy", "error").lower()
    if strategy not in ("error", "latest"):
        raise OptionError(f"option 'startingOffsetsByTimestampStrategy': {strategy!r} is not error or latest")
    ending = _offsets("endingOffsets", opts.get("endingoffsets", "latest"))
    if ending == "earliest":
        raise OptionError("option 'endingOffsets': earliest is not allowed (as in Spark's Kafka source)")
    return ReadOptions(
        bootstrap=opts["kafka.bootstrap.servers"], storage=opts["storage"], metadata=opts.get("metadata") or None,
        subscribe=tuple(t.strip() for t in opts.get("subscribe", "").split(",") if t.strip()),
        pattern=opts.get("subscribepattern"), assign=_assign(opts.get("assign")),
        starting=_offsets("startingOffsets", opts.get("startingoffsets", "earliest")), ending=ending,
        starting_ts=_timestamps("starting", opts), ending_ts=_timestamps("ending", opts), ts_strategy=strategy,
        include_headers=_bool("includeHeaders", opts.get("includeheaders", "false")),
        read_committed=isolation == "read_committed",
        fail_on_data_loss=_bool("failOnDataLoss", opts.get("failondataloss", "true")),
        include_live=_bool("includeLive", opts.get("includelive", "false")),
        max_bytes_per_partition=_positive("maxBytesPerPartition",
                                          opts.get("maxbytesperpartition", str(MAX_BYTES_PER_PARTITION))),
        min_partitions=_positive("minPartitions", opts["minpartitions"]) if "minpartitions" in opts else None)


def _bool(name: str, v: str) -> bool:
    if v.lower() not in ("true", "false"):
        raise OptionError(f"option {name!r}: {v!r} is not true or false")
    return v.lower() == "true"


def _positive(name: str, v: str) -> int:
    try:
        n = int(v)
    except ValueError:
        raise OptionError(f"option {name!r}: {v!r} is not an integer") from None
    if n <= 0:
        raise OptionError(f"option {name!r}: must be positive, got {n}")
    return n


def _json(name: str, v: str) -> dict[str, dict[str, int]]:
    try:
        data = json.loads(v)
    except json.JSONDecodeError as exc:
        raise OptionError(f"option {name!r}: not JSON ({exc})") from None
    if not isinstance(data, dict) or not all(isinstance(p, dict) for p in data.values()):
        raise OptionError(f"option {name!r}: expected {{\"topic\": {{\"partition\": number}}}}")
    try:
        return {str(t): {str(p): int(o) for p, o in ps.items()} for t, ps in data.items()}
    except (TypeError, ValueError):
        raise OptionError(f"option {name!r}: every value must be an integer") from None


def _per_partition(name: str, v: str) -> dict[tuple[str, int], int]:
    try:
        return {(t, int(p)): o for t, ps in _json(name, v).items() for p, o in ps.items()}
    except ValueError:
        raise OptionError(f"option {name!r}: partitions must be integers") from None


def _offsets(name: str, v: str) -> OffsetSpec:
    if v.strip().lower() in ("earliest", "latest"):
        return "earliest" if v.strip().lower() == "earliest" else "latest"
    spec = _per_partition(name, v)
    bad = [o for o in spec.values() if o < EARLIEST]
    if bad:
        raise OptionError(f"option {name!r}: offset {bad[0]} (use -2 for earliest, -1 for latest)")
    return spec


def _timestamps(which: str, opts: dict[str, str]) -> dict[tuple[str, int], int] | int | None:
    single, per = opts.get(f"{which}timestamp"), opts.get(f"{which}offsetsbytimestamp")
    if single is not None and per is not None:
        raise OptionError(f"options '{which}Timestamp' and '{which}OffsetsByTimestamp' exclude each other")
    if single is not None:
        try:
            return int(single)
        except ValueError:
            raise OptionError(f"option '{which}Timestamp': {single!r} is not milliseconds") from None
    return _per_partition(f"{which}OffsetsByTimestamp", per) if per is not None else None


def _assign(v: str | None) -> dict[str, list[int]] | None:
    if not v:
        return None
    try:
        data = json.loads(v)
        return {str(t): [int(p) for p in ps] for t, ps in data.items()}
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
        raise OptionError("option 'assign': expected {\"topic\": [0, 1]}") from None
