"""A compacted topic (`cleanup.policy=compact,delete`, compacted by A's cleaner before the pass) restored into B
(issue 66): a compacted topic refuses the filler's keyless records, so it is filled under `cleanup.policy=delete`
and gets its recorded configs back once the fill is verified; read from offset 0 through a proxy in front of B."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import run_cli
from tests.support.compacted import consume, latest
from tests.support.kafka import topic_config, watermarks
from tests.support.proxy import ProxyProcess
from tests.support.restore import CHANGELOG, Disaster

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def test_a_compacted_topic_is_restored_with_its_policy_and_read_from_offset_0(disaster: Disaster,
                                                                              tmp_path: Path) -> None:
    b = disaster.b
    run_cli("restore", "--bootstrap-server", b.bootstrap, "--storage", f"file://{disaster.tier}", "--metadata",
            "topic:", "--topics", CHANGELOG, check=True)
    assert topic_config(b.bootstrap, CHANGELOG, "cleanup.policy") == "compact,delete"
    assert topic_config(b.bootstrap, CHANGELOG, "min.cleanable.dirty.ratio") == "0.01"
    assert watermarks(b.bootstrap, CHANGELOG) == (disaster.changelog_end, disaster.changelog_end)
    p = ProxyProcess(b.bootstrap, tmp_path, extra={"TIERPROXY_STORAGE": f"file://{disaster.tier}",
                                                   "TIERPROXY_METADATA": "topic:"})
    try:
        got = consume(p.bootstrap, CHANGELOG, disaster.changelog_end, timeout=90)
    finally:
        p.stop()
    served = {o: (k, v) for o, k, v in disaster.changelog}
    assert got and all(served.get(o) == (k, v) for o, k, v in got)  # A's cleaner may have cleaned more by the pass
    assert latest(got) == latest(disaster.changelog)
