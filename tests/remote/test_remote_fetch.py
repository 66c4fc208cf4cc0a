"""Consumers read a topic from offset 0 through the proxy after the broker deleted its early segments."""

from __future__ import annotations

import subprocess

import pytest

from tests.realparts import ProxyProcess
from tests.remote.conftest import TieredTopic

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def test_kcat_reads_everything_from_offset_zero(tiered_proxy: tuple[TieredTopic, ProxyProcess], kcat: str) -> None:
    tt, proxy = tiered_proxy
    for partition in range(tt.partitions):
        out = subprocess.run([kcat, "-b", proxy.bootstrap, "-C", "-t", tt.topic, "-p", str(partition), "-o",
                              "beginning", "-e", "-q", "-f", "%o %k %s\\n", "-Z"], capture_output=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr.decode()[-2000:]
        lines = out.stdout.decode().splitlines()
        offsets = [int(line.split(" ", 1)[0]) for line in lines]
        assert offsets == list(range(len(tt.produced[partition])))
        got = [(line.split(" ")[1], line.split(" ", 2)[2]) for line in lines]
        want = [("NULL" if k is None else k.decode(), v.decode() if v else "") for k, v, _ in tt.produced[partition]]
        assert got == want
