"""`ProxyProcess.wait_tier_ready`, what tests and benchmarks wait on after a proxy's port opens (its tier is loaded
later): it returns once the tier's metadata is loaded and then once the proxy's own connections are made, and fails
at once, naming the log, when the process has ended."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.support.proxy import ProxyProcess
from tests.support.relay import DelayRelay
from tests.support.segments import seg, tp
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.tier.model import SegmentState
from tierproxy.tier.rlmm import transition
from tierproxy.tier.rlmm_file import FileRLMM

pytestmark = [pytest.mark.kafka]


def _file_tier(meta: Path) -> None:
    """A file tier's metadata holding one finished segment: a tier with a partition, so the proxy makes its own
    connections once the tier is loaded (a tier without partitions makes none)."""
    async def go() -> None:
        rlmm = FileRLMM(meta)
        await rlmm.start()
        try:
            md = seg(tp("ready-wait"), 0, 99)
            await rlmm.add_segment(md)
            await rlmm.update_segment(transition(md, SegmentState.COPY_SEGMENT_FINISHED))
        finally:
            await rlmm.close()

    asyncio.run(go())


def _proxy(kafka: KafkaCluster, tmp_path: Path, extra: dict[str, str] | None = None) -> ProxyProcess:
    _file_tier(tmp_path / "meta")
    return ProxyProcess(kafka.bootstrap, tmp_path, extra={"TIERPROXY_STORAGE": f"file://{tmp_path}/tier",
                                                          "TIERPROXY_METADATA": f"file://{tmp_path}/meta",
                                                          **(extra or {})})


def test_returns_once_the_tier_and_then_the_own_connections_are_ready(kafka: KafkaCluster, tmp_path: Path) -> None:
    """The proxy's own listener (command config's bootstrap.servers) behind a relay holding each request a second:
    the tier is ready a second or more after the port opens (the cluster's id asked first), the own connections a
    second or more after that (the tiered topics' Metadata): a wait that returned at the port, or at the tier when
    asked for the connections, finds its line missing."""
    relay = DelayRelay(int(kafka.bootstrap.rsplit(":", 1)[1]), delay=1.0)
    own = tmp_path / "own.properties"
    own.write_text(f"security.protocol=PLAINTEXT\nbootstrap.servers=127.0.0.1:{relay.port}\n")
    try:
        proxy = _proxy(kafka, tmp_path, {"TIERPROXY_COMMAND_CONFIG": str(own)})
        try:
            proxy.wait_tier_ready(timeout=60, connections=False)
            text = proxy.log_text()  # read once it returned: its line was there by then
            assert "remote tier ready: 1 partitions" in text, text[-3000:]
            proxy.wait_tier_ready(timeout=60)
            text = proxy.log_text()
            assert "own connections ready:" in text or "own connections not made ahead" in text, text[-3000:]
        finally:
            proxy.stop()
    finally:
        relay.close()


def test_fails_at_once_naming_the_log_when_the_process_has_ended(kafka: KafkaCluster, tmp_path: Path) -> None:
    proxy = _proxy(kafka, tmp_path)
    proxy.stop()
    start = time.monotonic()
    with pytest.raises(AssertionError, match="exited") as failed:
        proxy.wait_tier_ready(timeout=60)
    assert str(proxy.log) in str(failed.value)
    assert time.monotonic() - start < 5, "it waited out its timeout for a process that had ended"
