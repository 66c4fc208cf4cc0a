"""`tierproxy demo` (`make demo`): a real local Kafka, tierproxy (`serve` + a `tier` loop) with a filesystem tier,
a topic whose broker retention deletes its early data, and kcat showing the proxy still serves it from offset 0.
Every command is printed so it can be repeated by hand."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from protocol.constants import ApiKey, OffsetSpec
from protocol.requests import list_offsets_request
from tierproxy.dev.kafkadist import KAFKA_VERSION, KafkaCluster, stop_processes
from tierproxy.dev.ports import free_port_block
from tierproxy.kafka.wireclient import WireClient

TOPIC = "demo-history"
BROKER_PORTS = 100  # serve's broker.port.range: its broker ports follow its listener


class DemoFailed(Exception):
    """A step of the walk-through that did not do what it shows: said in one line, never a traceback."""


def _say(text: str) -> None:
    print(text, flush=True)


def _run(cmd: str, **kw: object) -> str:
    _say(f"  $ {cmd}")
    try:
        out = subprocess.run(cmd, shell=True, check=True, capture_output=True, text=True, timeout=120, **kw)  # type: ignore[call-overload]
    except subprocess.CalledProcessError as exc:
        raise DemoFailed(f"the command above exited with {exc.returncode}: {(exc.stderr or '').strip()[-500:]}") \
            from exc
    except subprocess.TimeoutExpired as exc:
        raise DemoFailed(f"the command above did not end in {exc.timeout:.0f}s") from exc
    return str(out.stdout)


def _check_running(procs: dict[str, subprocess.Popen[bytes]], work: Path) -> None:
    """DemoFailed naming the first of the demo's tierproxy processes that has ended, with its log's last lines."""
    for name, proc in procs.items():
        if proc.poll() is not None:
            tail = (work / f"{name}.log").read_text(errors="replace").strip().splitlines()[-5:]
            raise DemoFailed(f"`tierproxy {name}` exited with {proc.returncode}; its log ({work}/{name}.log) ends:\n"
                             + "\n".join(f"    {line}" for line in tail))


def proxy_ports() -> tuple[int, int]:
    """serve's listener and admin ports, from one free block: the listener, its broker ports after it (serve's
    default broker.port.base), then the admin port, never inside the broker ports (serve refuses that at start)."""
    listen = free_port_block(BROKER_PORTS + 2)
    return listen, listen + BROKER_PORTS + 1


def _log_start(bootstrap: str) -> int:
    with WireClient(bootstrap) as w:
        resp = w.request(ApiKey.LIST_OFFSETS, 7, list_offsets_request({TOPIC: {0: OffsetSpec.EARLIEST}}))
    return int(resp["topics"][0]["partitions"][0]["offset"])


def _set_topic_config(bootstrap: str, **configs: str) -> None:
    """AlterConfigs (non-incremental: the given set replaces the topic's overrides)."""
    async def run() -> None:
        from aiokafka.admin import AIOKafkaAdminClient
        from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, TOPIC, configs)])
        finally:
            await admin.close()

    asyncio.run(run())


def _tiered_end(admin: str) -> int:
    try:
        with urllib.request.urlopen(f"{admin}/v1/topics/{TOPIC}/partitions", timeout=5) as r:
            return int(json.load(r)[0]["tier_end"])
    except OSError:
        return -1


def run_demo(duration: float = 0.0, records: int = 1000) -> int:
    """Run the walk-through; keep everything up for `duration` seconds (0 = until Ctrl-C)."""
    kcat = shutil.which("kcat")
    if kcat is None:
        _say("kcat is needed for the demo (make install puts it there: apt-get install kcat)")
        return 1
    work = Path(tempfile.mkdtemp(prefix="tierproxy-demo-"))
    _say(f"Starting Apache Kafka {KAFKA_VERSION} (KRaft, resolved from Maven Central, cached after the first run)...")
    cluster = KafkaCluster(1, workdir=work / "kafka")
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        cluster.start()
        broker = cluster.bootstrap
        proxy_port, admin_port = proxy_ports()
        proxy, admin = f"127.0.0.1:{proxy_port}", f"http://127.0.0.1:{admin_port}"
        store, meta = f"file://{work}/tier", f"file://{work}/meta"
        _say(f"\nKafka is at {broker}. 1. Write {records} records to '{TOPIC}' (the broker rolls a segment a second):")
        _run(f"seq 0 {records - 1} | sed 's/^/record-/' | {kcat} -b {broker} -P -t {TOPIC}")
        _set_topic_config(broker, **{"segment.ms": "1000"})

        serve = [sys.executable, "-m", "tierproxy.cli", "serve", "--bootstrap-server", broker, "--listen", proxy,
                 "--admin-listen", f"127.0.0.1:{admin_port}", "--storage", store, "--metadata", meta]
        tier = [sys.executable, "-m", "tierproxy.cli", "tier", "--bootstrap-server", broker, "--storage", store,
                "--metadata", meta, "--interval", "5s", "--no-progress", "--master", "local[2]"]
        _say("\n2. Start tierproxy in front of the broker, and the tiering loop (PySpark, local mode):")
        for name, cmd in (("serve", serve), ("tier", tier)):
            _say("  $ tierproxy " + " ".join(cmd[3:]))
            log = open(work / f"{name}.log", "wb")  # noqa: SIM115 - owned by the child
            procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 180
        while _tiered_end(admin) < records - 1 and time.monotonic() < deadline:
            _check_running(procs, work)
            time.sleep(1)
        end = _tiered_end(admin)
        _say(f"  the tier now holds offsets 0..{end} (tierproxy admin --url {admin} partitions {TOPIC})")
        if end < records - 1:  # step 3 deletes the broker's copy: only once the tier holds every record
            _check_running(procs, work)
            raise DemoFailed(f"the tier does not hold offsets 0..{records - 1} after 180s; the broker's data is left "
                             f"as it is (logs: {work}/serve.log, {work}/tier.log)")

        _say("\n3. Make the broker delete its old segments (retention.ms=1000) and wait until it has:")
        _set_topic_config(broker, **{"segment.ms": "1000", "retention.ms": "1000"})
        deadline = time.monotonic() + 120
        while _log_start(broker) == 0 and time.monotonic() < deadline:
            subprocess.run([kcat, "-b", broker, "-P", "-t", TOPIC], input=b"tick\n", check=True, timeout=30)
            time.sleep(1)
        _set_topic_config(broker, **{"segment.ms": "1000", "retention.ms": "3600000"})
        _say(f"  the broker's log now starts at offset {_log_start(broker)}")

        _say("\n4. Read from the beginning, directly from the broker, then through tierproxy:")
        direct = _run(f"{kcat} -b {broker} -C -t {TOPIC} -o beginning -e -q -f '%o %s\\n' | head -3")
        _say("    " + direct.replace("\n", "\n    ").rstrip())
        through = _run(f"{kcat} -b {proxy} -C -t {TOPIC} -o beginning -e -q -f '%o %s\\n' | head -3")
        _say("    " + through.replace("\n", "\n    ").rstrip())
        full = _run(f"{kcat} -b {proxy} -C -t {TOPIC} -o beginning -e -q | grep -c record-")
        ok = through.startswith("0 record-0") and int(full.strip()) == records
        _say(f"\n{'OK' if ok else 'FAILED'}: through tierproxy all {full.strip()} records are there from offset 0, "
             f"served from the tier ({work}/tier); the broker alone starts at {_log_start(broker)}.")
        _say(f"Try: kcat -b {proxy} -L    |    curl {admin}/metrics    |    "
             f"tierproxy admin --url {admin} status\nLogs: {work}")
        if duration >= 0:
            deadline = time.monotonic() + duration if duration > 0 else float("inf")
            while time.monotonic() < deadline:
                time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        return 0 if ok else 1
    except KeyboardInterrupt:
        return 0
    except DemoFailed as exc:
        _say(f"\nFAILED: {exc}")
        return 1
    except Exception as exc:  # the broker did not start or stopped answering, a client library's error: one line
        _say(f"\nFAILED: {type(exc).__name__}: {exc} (logs: {work})")
        return 1
    finally:
        stop_processes(list(procs.values()))
        cluster.stop()
        _say("Stopped.")
