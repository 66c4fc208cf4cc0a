"""A real Kafka Streams application for tests: `tests/streams/TableApp.java`, a KTable read from an input topic into
a RocksDB store whose changelog topic takes the configs a test gives (Kafka's own `kafka-streams` jar, the tested
version). Compiled once per source and Kafka version into the cache (javac takes seconds; the single-file
launcher would pay it at every start), run as a JVM with the run's options (`jvm.java_command`).

The store is RocksDB, Streams' default for a KTable: its state lives in the state directory, so wiping that
directory is what losing an instance's disk is, and the next start restores everything from the changelog (an
in-memory store restores at every start, wiped or not)."""

from __future__ import annotations

import hashlib
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from tests.support.jvm import java_command
from tierproxy.dev.kafkadist import KAFKA_VERSION, ensure_kafka_libs
from tierproxy.dev.maven import cache_dir, locked

SOURCE = Path(__file__).parents[1] / "streams" / "TableApp.java"
MAIN = "TableApp"
STORE = "table"  # the store's name in TableApp.java: its changelog is `<application.id>-table-changelog`

Update = tuple[str, str | None]  # key, value (None: a tombstone)


def compiled() -> Path:
    """The directory holding TableApp's classes, compiled (for Java 17, any later JDK runs them) at the first call
    for this source and Kafka version."""
    digest = hashlib.sha256(SOURCE.read_bytes() + KAFKA_VERSION.encode())
    root = cache_dir() / "streams-app"
    out = root / digest.hexdigest()[:16]
    if (out / f"{MAIN}.class").exists():
        return out
    libs = ensure_kafka_libs()
    with locked(root):  # parallel workers compile once
        if not (out / f"{MAIN}.class").exists():
            tmp = root / f"{out.name}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            subprocess.run(["javac", "-nowarn", "--release", "17", "-cp", f"{libs}/*", "-d", str(tmp), str(SOURCE)],
                           check=True, capture_output=True, timeout=300)
            tmp.rename(out)
    return out


def changelog_of(app_id: str) -> str:
    return f"{app_id}-{STORE}-changelog"


def table_updates(n: int, keys: int, tombstones: float = 0.05, seed: int = 66) -> list[Update]:
    """`n` updates over `keys` keys drawn at random, a `tombstones` share of them deletes."""
    r = random.Random(seed)
    return [(f"key-{r.randrange(keys):07d}", None if r.random() < tombstones else f"value-{i}-{r.getrandbits(32):x}")
            for i in range(n)]


def final_state(updates: Sequence[Update]) -> dict[str, str]:
    """The table the whole input makes: per key the last value, none where the last update is a tombstone."""
    state: dict[str, str] = {}
    for key, value in updates:
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    return state


def produce_updates(bootstrap: str, topic: str, updates: Sequence[Update], timestamps: Sequence[int]) -> None:
    """The updates in order, each with its timestamp (Streams gives a changelog record its input's timestamp, so
    these decide what the changelog's time retention deletes); a key's updates stay in order (idempotence)."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
    for i, ((key, value), ts) in enumerate(zip(updates, timestamps, strict=True)):
        while True:
            try:
                p.produce(topic, value.encode() if value is not None else None, key.encode(), timestamp=ts)
                break
            except BufferError:  # the local queue is full: let it drain
                p.poll(0.1)
        if i % 10_000 == 0:
            p.poll(0)
    assert p.flush(120) == 0, "updates left unsent"


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> list[int]:
    """The group's committed offsets of the topic's partitions (-1001: none)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        return [tp.offset for tp in c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)]
    finally:
        c.close()


@dataclass(frozen=True)
class Restore:
    """What Streams' restore listener saw of one changelog partition: where it began and ended, how many records."""
    partition: int
    start: int
    end: int
    records: int


class TableApp:
    """TableApp.java with one application id, input topic and state directory; `build` runs it in the background
    (stopped with `stop`), `dump` runs it until its restored store is written out."""

    def __init__(self, workdir: Path, app_id: str, source: str, partitions: int, changelog: dict[str, str],
                 heap: str = "256m") -> None:
        self.workdir, self.app_id, self.source, self.partitions = workdir, app_id, source, partitions
        self.state_dir = workdir / f"{app_id}-state"
        self.changelog = [f"{k}={v}" for k, v in changelog.items()]
        self.heap = heap
        self.proc: subprocess.Popen[bytes] | None = None

    def _command(self, mode: str, bootstrap: str, out: Path) -> list[str]:
        logs = self.workdir / f"{self.app_id}-{mode}-logs"  # Streams' own log (log4j2, INFO) for a failure's reader
        return [*java_command(), f"-Xmx{self.heap}", f"-Dkafka.logs.dir={logs}",
                f"-Dlog4j2.configurationFile={ensure_kafka_libs().parent / 'log4j2.properties'}",
                "-cp", f"{compiled()}:{ensure_kafka_libs()}/*", MAIN, mode, bootstrap, self.app_id, self.source,
                str(self.partitions), str(self.state_dir), str(out), *self.changelog]

    def build(self, bootstrap: str) -> None:
        """Start the app: it reads the input into its table (and changelog) until `stop`."""
        self.log = self.workdir / f"{self.app_id}-build.out"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self._command("build", bootstrap, self.workdir / "unused"), stdout=out,
                                         stderr=subprocess.STDOUT)

    def caught_up(self, bootstrap: str) -> bool:
        """The app committed the input's end on every partition, or ended (`stop` says so: a wait ends at once)."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            return True
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{self.app_id}-ends"})
        try:
            ends = [c.get_watermark_offsets(TopicPartition(self.source, p), timeout=10, cached=False)[1]
                    for p in range(self.partitions)]
        finally:
            c.close()
        return committed(bootstrap, self.app_id, self.source, self.partitions) == ends

    def stop(self) -> None:
        """SIGTERM: KafkaStreams.close() commits what it processed. Fails if the app had ended by itself."""
        assert self.proc is not None
        assert self.proc.poll() is None, f"the app ended: {self.log.read_text(errors='replace')[-3000:]}"
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise

    def wipe(self) -> None:
        """The instance's disk is lost: its state directory (the RocksDB store and its checkpoint) goes."""
        shutil.rmtree(self.state_dir)

    def dump(self, bootstrap: str, timeout: float = 300) -> tuple[dict[str, str], list[Restore]]:
        """Run the app against `bootstrap` until every changelog partition is restored; its store, key → value,
        and what its restore listener saw."""
        out = self.workdir / f"{self.app_id}-dump.tsv"
        log = self.workdir / f"{self.app_id}-dump.out"
        began = time.monotonic()
        with open(log, "wb") as f:
            rc = subprocess.run(self._command("dump", bootstrap, out), stdout=f, stderr=subprocess.STDOUT,
                                timeout=timeout).returncode
        text = log.read_text(errors="replace")
        took = time.monotonic() - began
        assert rc == 0 and out.exists(), f"the app failed (exit {rc}) after {took:.0f}s: {text[-3000:]}"
        state = dict(line.split("\t", 1) for line in out.read_text().splitlines())
        restores = [Restore(*map(int, line.split()[1:])) for line in text.splitlines() if line.startswith("restore ")]
        return state, sorted(restores, key=lambda r: r.partition)


def latest_by_key(bootstrap: str, topic: str, partitions: int, timeout: float = 60) -> dict[str, str | None]:
    """Per key the last value a plain consumer reads through `bootstrap` from each partition's earliest offset to
    its high watermark (None: a tombstone)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"latest-{time.monotonic_ns()}",
                  "enable.auto.commit": False})
    try:
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
                for p in range(partitions)}
        c.assign([TopicPartition(topic, p, -2) for p in range(partitions)])  # -2: OFFSET_BEGINNING
        latest: dict[str, str | None] = {}
        left = {p for p, end in ends.items() if end > 0}
        deadline = time.monotonic() + timeout
        while left and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                if m.error() is not None:
                    continue
                latest[m.key().decode()] = None if m.value() is None else m.value().decode()
                if m.offset() + 1 >= ends[m.partition()]:
                    left.discard(m.partition())
        assert not left, f"partitions {sorted(left)} of {topic} not read to their end in {timeout:.0f}s"
        return latest
    finally:
        c.close()
