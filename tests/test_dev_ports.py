"""The test servers' ports: below the kernel's ephemeral range, from a share of the worker's own, never handed out
twice in a row (a port the kernel picks can be taken by any client socket before the server binds it)."""

from __future__ import annotations

import itertools
import socket
from pathlib import Path

import pytest

from tierproxy.dev import ports


def _ephemeral_low() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_worker_shares_are_disjoint_and_below_the_ephemeral_range() -> None:
    for count in (1, 2, 3, 8):
        spans = [tuple(int(x) for x in ports.worker_share(i, count).split("-")) for i in range(count)]
        assert spans[0][0] == ports.FIRST_PORT
        for (_, high), (low, _) in itertools.pairwise(spans):
            assert high == low  # contiguous, no overlap
        assert spans[-1][1] <= max(_ephemeral_low(), ports.FIRST_PORT + 1000 * count)
        assert all(high - low >= 1000 for low, high in spans)


def test_ports_come_from_the_share_and_are_not_handed_out_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_handed", {})
    monkeypatch.setenv(ports.ENV, "6200-6230")  # below every worker's share: no other test's server is there
    seen = [ports.free_port() for _ in range(30)]
    assert sorted(seen) == list(range(6200, 6230))  # each once, all from the share
    with pytest.raises(RuntimeError, match="no block of 1 free ports in 6200-6230"):
        ports.free_port()
    monkeypatch.setattr(ports, "_handed", {})
    assert ports.free_port_block(30) == 6200
    with pytest.raises(RuntimeError, match="no block of 1 free ports"):
        ports.free_port()


def test_a_port_in_use_is_not_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ports.ENV, raising=False)
    taken = ports.free_port_block(2)
    monkeypatch.setattr(ports, "_handed", {})  # forget it: only the listener below keeps it from being picked
    with socket.socket() as held:
        held.bind(("127.0.0.1", taken))
        held.listen()
        monkeypatch.setenv(ports.ENV, f"{taken}-{taken + 2}")
        assert ports.free_port() == taken + 1


def test_without_a_share_ports_are_below_the_ephemeral_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ports.ENV, raising=False)
    low, high = ports.port_space()
    assert (low, high) == (ports.FIRST_PORT, _ephemeral_low())
    assert all(low <= ports.free_port() < high for _ in range(5))


@pytest.mark.parametrize("spec", ["10000", "b-c", "20000-10000", "100-2000"])
def test_a_bad_share_names_the_variable_and_its_value(monkeypatch: pytest.MonkeyPatch, spec: str) -> None:
    monkeypatch.setenv(ports.ENV, spec)
    with pytest.raises(ValueError, match=f"TIERPROXY_DEV_PORTS='{spec}'"):
        ports.free_port()
