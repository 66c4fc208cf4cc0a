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
from tierproxy.dev.ports import free_port
from tierproxy.kafka.wireclient import WireClient

TOPIC = "demo-history"


def _say(text: str) -> None:
    print(text, flush=True)


def _run(cmd: str, **kw: object) -> str:
    _say(f"  $ {cmd}")
    out = subprocess.run(cmd, shell=True, check=True, capture_output=True, text=True, timeout=120, **kw)  # type: ignore[call-overload]
    return str(out.stdout)


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
    procs: list[subprocess.Popen[bytes]] = []
    try:
        cluster.start()
        broker = cluster.bootstrap
        proxy_port, admin_port = free_port(), free_port()
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
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 180
        while _tiered_end(admin) < records - 1 and time.monotonic() < deadline:
            time.sleep(1)
        _say(f"  the tier now holds offsets 0..{_tiered_end(admin)} (tierproxy admin --url {admin} partitions "
             f"{TOPIC})")

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
    finally:
        stop_processes(procs)
        cluster.stop()
        _say("Stopped.")
