"""Two signals in quick succession (a second Ctrl-C, or `timeout -s INT` after one) stop every long-running command
as one does: no traceback, every process it started gone (the demo's Kafka, the tier loop's Spark JVM), its ports
free. Before: the second KeyboardInterrupt landed in the `finally` that stops the children, printed a traceback
and left the Kafka JVM running."""

from __future__ import annotations

import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.kafka import create_topic, small_segment_producer, small_segments
from tests.support.parts import descendants, free_port_block
from tests.support.stopping import Started, comm
from tests.support.waiting import wait_until
from tierproxy.dev.kafkadist import KafkaCluster

pytestmark = [pytest.mark.kafka, pytest.mark.process]


@pytest.fixture
def started() -> Iterator[list[Started]]:
    runs: list[Started] = []
    yield runs
    for run in runs:
        run.kill()


@pytest.mark.spark
@pytest.mark.kcat
def test_demo_two_ctrl_c_stop_kafka_serve_and_the_tier_loop(kcat: str, tmp_path: Path,
                                                              started: list[Started]) -> None:
    """Ctrl-C twice on `make demo` while its broker, `serve` and the tier loop's Spark run."""
    demo = Started([sys.executable, "-m", "tierproxy.cli", "demo", "--duration", "0"], tmp_path / "demo.out")
    started.append(demo)

    def javas() -> int:
        return sum(1 for p in descendants(demo.proc.pid) if comm(p) == "java")

    # the broker's JVM and the tier loop's Spark JVM
    wait_until(lambda: javas() >= 2 or demo.proc.poll() is not None, "the demo's Kafka and Spark", timeout=300)
    assert demo.proc.poll() is None, demo.text()[-3000:]
    ports = [int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", demo.text())]
    assert ports, demo.text()
    pids = demo.signal_twice(signal.SIGINT, group=True)
    demo.assert_stopped_cleanly(pids, ports, codes=(0,))
    assert "Stopped." in demo.text()
    work = Path(re.findall(r"file://(/\S+)/tier", demo.text())[0])
    for child in ("serve", "tier"):  # the group's Ctrl-C reached them too
        log = (work / f"{child}.log").read_text(errors="replace")
        assert "Traceback" not in log, log[-3000:]


@pytest.mark.spark
def test_tier_loop_two_sigterms_stop_its_spark(kafka: KafkaCluster, tmp_path: Path, topic_name: str,
                                               started: list[Started]) -> None:
    """`tier --interval` as its Spark JVM starts for the first pass: SIGTERM twice (as `timeout`, then a second
    stop). Before: exit -15 (the second signal met the default action), or, once the first was handled, PySpark's
    gateway JVM interrupted before it connected was left running. (Between passes it stopped cleanly already.)"""
    create_topic(kafka.bootstrap, topic_name, config=small_segments())
    producer = small_segment_producer(kafka.bootstrap)
    for i in range(300):
        producer.produce(topic_name, b"x" * 100, f"k{i}".encode())
    producer.flush(60)
    tier = Started([sys.executable, "-m", "tierproxy.cli", "tier", "--no-progress", "--interval", "1h",
                    "--bootstrap-server", kafka.bootstrap, "--storage", f"file://{tmp_path}/tier",
                    "--metadata", f"file://{tmp_path}/meta", "--topics", re.escape(topic_name),
                    "--master", "local[1]"], tmp_path / "tier.out",
                   env={"TIERPROXY_TIER_STATE_DIR": str(tmp_path / "state")})
    started.append(tier)
    wait_until(lambda: any(comm(p) == "java" for p in descendants(tier.proc.pid))
               or tier.proc.poll() is not None, "the tier loop's Spark", timeout=300)
    assert tier.proc.poll() is None, tier.text()[-3000:]
    pids = tier.signal_twice(signal.SIGTERM, group=False)
    assert any(comm(p) == "java" for p in pids), [(p, comm(p)) for p in pids]
    tier.assert_stopped_cleanly(pids, [], codes=(130,))


def test_serve_two_ctrl_c(kafka: KafkaCluster, tmp_path: Path, started: list[Started]) -> None:
    listen, admin = free_port_block(1), free_port_block(1)
    serve = Started([sys.executable, "-m", "tierproxy.cli", "serve", "--bootstrap-server", kafka.bootstrap,
                     "--listen", f"127.0.0.1:{listen}", "--admin-listen", f"127.0.0.1:{admin}",
                     "--storage", f"file://{tmp_path}/tier", "--metadata", f"file://{tmp_path}/meta"],
                    tmp_path / "serve.out", env={"TIERPROXY_BROKER_PORT_BASE": str(free_port_block(2)),
                                                 "TIERPROXY_BROKER_PORT_RANGE": "2"})
    started.append(serve)
    wait_until(lambda: "admin API on" in serve.text() or serve.proc.poll() is not None, "serve listening",
               timeout=120)
    assert serve.proc.poll() is None, serve.text()[-3000:]
    pids = serve.signal_twice(signal.SIGINT, group=True)
    serve.assert_stopped_cleanly(pids, [listen, admin], codes=(0,))


@pytest.mark.parametrize("command", ["serve", "tier"])
def test_ctrl_c_twice_while_a_command_starts(kafka: KafkaCluster, tmp_path: Path, started: list[Started],
                                             command: str) -> None:
    """Ctrl-C twice a second after the start (imports, settings, start-up checks: before the command's own
    handling of signals): one line, no traceback."""
    listen = free_port_block(1)
    args = {"serve": ["--listen", f"127.0.0.1:{listen}"], "tier": ["--interval", "1h", "--master", "local[1]"]}
    run = Started([sys.executable, "-m", "tierproxy.cli", command, "--bootstrap-server", kafka.bootstrap,
                   "--storage", f"file://{tmp_path}/tier", "--metadata", f"file://{tmp_path}/meta",
                   *args[command]], tmp_path / f"{command}.out",
                  env={"TIERPROXY_BROKER_PORT_BASE": str(free_port_block(2)), "TIERPROXY_BROKER_PORT_RANGE": "2",
                       "TIERPROXY_TIER_STATE_DIR": str(tmp_path / "state")})
    started.append(run)
    time.sleep(1.0)  # the moment under test: a second into the start, whatever the command is doing then
    assert run.proc.poll() is None, run.text()
    pids = run.signal_twice(signal.SIGINT, group=True)
    run.assert_stopped_cleanly(pids, [listen], codes=(0, 130))
