"""A real Apache Kafka for tests and the demo, resolved from Maven Central.

`ensure_kafka_libs()` resolves the jars once into the project cache (`dev.maven`) and reuses them afterwards.
`KafkaCluster` formats KRaft log dirs and starts combined broker+controller nodes with
``java -cp <libs>/* kafka.Kafka`` on free loopback ports; `start()` returns once every broker answers ApiVersions
and Metadata lists them all.
"""

from __future__ import annotations

import base64
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from tierproxy.dev import classshare
from tierproxy.dev.maven import Artifact, MavenUnavailable, resolve
from tierproxy.dev.ports import free_port

KAFKA_VERSION = "4.1.1"
SCALA_VERSION = "2.13"
LOG4J_VERSION = "2.24.3"

ARTIFACTS = (
    Artifact("org.apache.kafka", f"kafka_{SCALA_VERSION}", KAFKA_VERSION),
    Artifact("org.apache.kafka", "kafka-tools", KAFKA_VERSION),
    Artifact("org.apache.kafka", "kafka-streams", KAFKA_VERSION),
    Artifact("org.apache.kafka", "kafka-storage", KAFKA_VERSION, "test"),
    Artifact("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J_VERSION),
)
# the other release lines the tests keep tierproxy working with (tests/test_kafka_versions.py): the broker and its
# tools only
OTHER_VERSIONS = ("3.6.2", "3.9.2", "4.0.2", "4.3.1", "4.4.0")


def artifacts(version: str) -> tuple[Artifact, ...]:
    if version == KAFKA_VERSION:
        return ARTIFACTS
    out: tuple[Artifact, ...] = (Artifact("org.apache.kafka", f"kafka_{SCALA_VERSION}", version),
                                 Artifact("org.apache.kafka", "kafka-tools", version))
    if _major(version) >= 4:  # log4j2 (Kafka 3 logs through reload4j, which its own jars bring)
        out += (Artifact("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J_VERSION),)
    return out


def _major(version: str) -> int:
    return int(version.split(".")[0])

_LOG4J1 = """log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File=${kafka.logs.dir}/server.log
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.state.change.logger=WARN
"""

_LOG4J2 = """status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = ${sys:kafka.logs.dir}/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.state.name = state.change.logger
logger.state.level = WARN
"""


class KafkaUnavailable(RuntimeError):
    """The real Kafka could not be resolved or started; the message says why."""


def ensure_kafka_libs(version: str = KAFKA_VERSION) -> Path:
    """Return a directory holding the Kafka broker, tools, Streams and storage-test jars (another `version`: the
    broker and tools), resolving them once (and again when the list of artifacts changes)."""
    try:
        libs = resolve(f"kafka-{version}", artifacts(version))
    except MavenUnavailable as exc:
        raise KafkaUnavailable(str(exc)) from None
    if _major(version) >= 4:
        for stray in libs.glob("slf4j-reload4j*.jar"):
            stray.unlink()  # log4j2 is Kafka 4's logging backend
    config = libs.parent / ("log4j2.properties" if _major(version) >= 4 else "log4j.properties")
    if not config.exists():
        config.write_text(_LOG4J2 if _major(version) >= 4 else _LOG4J1)
    return libs


def storage_test_jar() -> Path:
    """The jar holding Kafka's `LocalTieredStorage` (a filesystem RemoteStorageManager)."""
    return ensure_kafka_libs() / f"kafka-storage-{KAFKA_VERSION}-test.jar"


def stop_processes(procs: list[subprocess.Popen[bytes]], timeout: float = 30.0) -> None:
    """SIGTERM every process, then wait for each (SIGKILL one that outlives `timeout`)."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _api_versions_ok(port: int, timeout: float = 1.0) -> bool:
    # ApiVersions v0: size, api_key=18, api_version=0, correlation_id, client_id (int16 length + bytes)
    req = struct.pack(">hhih", 18, 0, 1, 3) + b"cli"
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(struct.pack(">i", len(req)) + req)
            head = s.recv(4)
            if len(head) < 4:
                return False
            body = s.recv(struct.unpack(">i", head)[0])
            return len(body) >= 6 and struct.unpack_from(">ih", body)[1] == 0
    except OSError:
        return False


def _metadata_broker_count(port: int, timeout: float = 2.0) -> int:
    # Metadata v1 with an empty topic array: answers the broker list only.
    req = struct.pack(">hhih", 3, 1, 2, 3) + b"cli" + struct.pack(">i", 0)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(struct.pack(">i", len(req)) + req)
            head = _recv_exact(s, 4)
            body = _recv_exact(s, struct.unpack(">i", head)[0])
    except OSError:
        return 0
    return int(struct.unpack_from(">i", body, 4)[0])  # after correlation id: brokers array length


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise OSError("connection closed")
        buf += chunk
    return bytes(buf)


def _cluster_id() -> str:
    """A random Kafka cluster id (base64url of a UUID) that argparse cannot mistake for an option."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


@dataclass
class KafkaNode:
    """One combined broker+controller JVM."""

    node_id: int
    port: int
    controller_port: int
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None
    extra: dict[str, str] = field(default_factory=dict)
    listener_ports: dict[str, int] = field(default_factory=dict)  # extra listener name → port

    def address(self, listener: str) -> str:
        return f"127.0.0.1:{self.listener_ports[listener]}"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.workdir / "server.log"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class KafkaCluster:
    """1 or 3 combined KRaft nodes on free loopback ports, with logs under ``workdir``."""

    # options on every node's (and storage format's) java command line, before the cluster's own: a test run sets
    # them once (tests/conftest.py: C1 only, which halves what a short-lived broker spends compiling itself)
    default_jvm_options: ClassVar[list[str]] = []
    # the nodes and their storage format read their classes from an archive (dev.classshare, `train_class_archive`)
    # once it is there; for the pinned version only (training one costs about three starts: other versions start
    # once or twice a run)
    class_sharing: ClassVar[bool] = False
    # broker settings under every cluster's own `broker_config` (a test run's: fewer idle wake-ups)
    default_broker_config: ClassVar[dict[str, str]] = {}

    def __init__(self, nodes: int = 1, workdir: Path | None = None,
                 broker_config: dict[str, str] | None = None, heap: str = "768m",
                 extra_listeners: dict[str, str] | None = None, jvm_options: list[str] | None = None,
                 scram_users: dict[str, dict[str, str]] | None = None, version: str = KAFKA_VERSION,
                 port: int | None = None, cluster_id: str | None = None) -> None:
        """`extra_listeners` maps listener names to security protocols (e.g. {"SASL": "SASL_PLAINTEXT"}); each
        node gets a free port for each, in `node.listener_ports`; their settings go in `broker_config`.
        `jvm_options` are added to each node's java command line (e.g. -D system properties); `scram_users`
        ({mechanism: {user: password}}) are written into the metadata log when the storage is formatted.
        `port`: the first node's client port (`make kafka`'s 9092) instead of a free one; `cluster_id`: the id of
        log dirs formatted before (a cluster started again), instead of a new one."""
        self.version = version
        self.libs = ensure_kafka_libs(version)
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="tierproxy-kafka-"))
        self.cluster_id = cluster_id or _cluster_id()
        self.heap = heap
        self.broker_config = dict(broker_config or {})
        self.nodes = [KafkaNode(i + 1, port if port is not None and i == 0 else free_port(), free_port(),
                                self.workdir / f"node{i + 1}") for i in range(nodes)]
        self.extra_listeners = dict(extra_listeners or {})
        self.jvm_options = list(jvm_options or [])
        self.scram_users = dict(scram_users or {})
        for n in self.nodes:
            n.listener_ports = {name: free_port() for name in self.extra_listeners}
        self._shared: list[str] = []  # the class data sharing options of every JVM of this cluster
        self._dumping: list[str] = []  # a training cluster's node: where it writes the archive at its exit

    def bootstrap_for(self, listener: str) -> str:
        return ",".join(n.address(listener) for n in self.nodes)

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes)

    def node(self, node_id: int) -> KafkaNode:
        return next(n for n in self.nodes if n.node_id == node_id)

    def _props(self, node: KafkaNode) -> str:
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)
        rf = str(min(3, len(self.nodes)))
        extra_l = "".join(f",{name}://127.0.0.1:{node.listener_ports[name]}" for name in self.extra_listeners)
        extra_p = "".join(f",{name}:{proto}" for name, proto in self.extra_listeners.items())
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}{extra_l}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{node.port}{extra_l}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": f"PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT{extra_p}",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(node.workdir / "data"),
            "num.partitions": "1",
            "offsets.topic.replication.factor": rf,
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": rf,
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # let tests see retention act within seconds
            "log.retention.check.interval.ms": "1000",
            "log.initial.task.delay.ms": "0",
            "log.cleaner.backoff.ms": "500",
            "auto.create.topics.enable": "true",
        }
        props.update(self.default_broker_config)
        props.update(self.broker_config)
        props.update(node.extra)
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def _java(self, main: str, *args: str, node: KafkaNode) -> list[str]:
        return ["java", f"-Xmx{self.heap}", "-Xms128m", "-XX:+UseG1GC", *self.default_jvm_options, *self._shared,
                *self.jvm_options,
                f"-Dkafka.logs.dir={node.workdir}",
                f"-Dlog4j2.configurationFile={self.libs.parent / 'log4j2.properties'}" if _major(self.version) >= 4
                else f"-Dlog4j.configuration=file:{self.libs.parent / 'log4j.properties'}",
                "-cp", f"{self.libs}/*", main, *args]

    def start(self, timeout: float = 120.0) -> KafkaCluster:
        if shutil.which("java") is None:
            raise KafkaUnavailable("java not found on PATH: Kafka 4.x needs Java 17+")
        if self.class_sharing and self.version == KAFKA_VERSION and not self._dumping:
            self._shared = classshare.sharing_options(class_archive(self.version))
        for node in self.nodes:
            node.workdir.mkdir(parents=True, exist_ok=True)
            props = node.workdir / "server.properties"
            props.write_text(self._props(node))
            scram = [arg for mech, users in self.scram_users.items() for user, password in users.items()
                     for arg in ("--add-scram", f"{mech}=[name={user},password={password}]")]
            fmt = subprocess.run(self._java("kafka.tools.StorageTool", "format", "-t", self.cluster_id,
                                            "-c", str(props), "--ignore-formatted", *scram, node=node),
                                 capture_output=True, text=True, timeout=120)
            if fmt.returncode != 0:
                raise KafkaUnavailable(f"kafka-storage format failed for node {node.node_id}:\n"
                                       f"{fmt.stdout[-2000:]}{fmt.stderr[-2000:]}")
        for node in self.nodes:
            self.start_node(node.node_id, wait=False)
        self.wait_ready(timeout)
        return self

    def start_node(self, node_id: int, wait: bool = True, timeout: float = 120.0) -> None:
        node = self.node(node_id)
        out = open(node.workdir / "stdout.log", "ab")  # noqa: SIM115 - owned by the child process
        cmd = self._java("kafka.Kafka", str(node.workdir / "server.properties"), node=node)
        node.proc = subprocess.Popen(cmd[:1] + self._dumping + cmd[1:],
                                     stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        if wait:
            self.wait_ready(timeout, nodes=[node])

    def wait_ready(self, timeout: float = 120.0, nodes: list[KafkaNode] | None = None) -> None:
        deadline = time.monotonic() + timeout
        pending = list(nodes or self.nodes)
        while pending and time.monotonic() < deadline:
            node = pending[0]
            if not node.alive:
                raise KafkaUnavailable(f"Kafka node {node.node_id} exited at start:\n{self.tail_logs(node)}")
            live = sum(1 for n in self.nodes if n.alive)
            if _api_versions_ok(node.port) and _metadata_broker_count(node.port) >= live:
                pending.pop(0)
            else:
                time.sleep(0.2)
        if pending:
            raise KafkaUnavailable(f"Kafka not ready after {timeout:.0f}s:\n{self.tail_logs(pending[0])}")

    def stop_node(self, node_id: int, kill: bool = False, timeout: float = 60.0) -> None:
        node = self.node(node_id)
        if node.proc is None:
            return
        if node.proc.poll() is None:
            node.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                node.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait(10)
        node.proc = None

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM every node at once (a lone survivor would wait for a lost quorum), SIGKILL stragglers."""
        live = [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]
        for n in live:
            assert n.proc is not None
            n.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for n in live:
            assert n.proc is not None
            try:
                n.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                n.proc.kill()
                n.proc.wait(10)
        for n in self.nodes:
            n.proc = None

    def tail_logs(self, node: KafkaNode | None = None, lines: int = 60) -> str:
        parts = []
        for n in [node] if node else self.nodes:
            for f in (n.log_file, n.workdir / "stdout.log"):
                if f.exists():
                    text = f.read_text(errors="replace").splitlines()[-lines:]
                    parts.append(f"--- {f} ---\n" + "\n".join(text))
        return "\n".join(parts)

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def class_archive(version: str = KAFKA_VERSION) -> Path:
    """Where the class data sharing archive of this version's nodes lives (`dev.classshare`), made or not."""
    return classshare.archive_path(f"kafka-{version}", f"{ensure_kafka_libs(version)}/*",
                                   KafkaCluster.default_jvm_options)


def train_class_archive(version: str = KAFKA_VERSION) -> bool:
    """Make the nodes' class data sharing archive unless it is there: a node started and stopped, writing it at
    its exit."""
    def run(dump: list[str]) -> None:
        with tempfile.TemporaryDirectory(prefix="tierproxy-cds-") as d:
            trainer = KafkaCluster(1, workdir=Path(d), version=version)
            trainer._dumping = dump
            try:
                trainer.start()
            finally:
                trainer.stop(timeout=60)

    return classshare.train(class_archive(version), run)
