"""An ordinary mistake on the command line is one line and an exit code, never a traceback."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.cli import run_cli
from tests.support.parts import free_port_block
from tierproxy.dev.ports import free_port


@pytest.mark.parametrize(("args", "says"), [
    (["serve", "--bootstrap-server", "127.0.0.1:1", "--listen", "127.0.0.1:{p}", "--admin-listen", "127.0.0.1:{p}"],
     "admin.listen 127.0.0.1:{p}: the same port as listen"),
    (["serve", "--bootstrap-server", "127.0.0.1:1", "--listen", "127.0.0.1:{p}", "--admin-listen", "127.0.0.1:{p+7}"],
     "admin.listen 127.0.0.1:{p+7}: inside the broker port range {p+1}..{p+100}"),
    (["serve", "--bootstrap-server", "127.0.0.1:1", "--listen", "127.0.0.1:99999"],
     "port 99999 is out of range (0..65535)"),
    (["serve", "--bootstrap-server", "127.0.0.1:1", "--listen", "127.0.0.1:{p}", "--workers", "0"],
     "workers: '0': a number of processes from 1 to 256, or auto"),
    (["serve", "--bootstrap-server", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--workers", "2"],
     "workers=2: needs a fixed listen port"),
    (["tier", "--bootstrap-server", "127.0.0.1:1", "--storage", "file:///nonexistent", "--once",
      "--spark-conf", "nonsense"], "--spark-conf 'nonsense': expected KEY=VALUE"),
])
def test_a_bad_argument_is_one_line_and_exit_2(args: list[str], says: str) -> None:
    port = free_port_block(101)

    def filled(text: str) -> str:  # {p}, {p+N}: the listen port and ports after it
        return re.sub(r"\{p(?:\+(\d+))?\}", lambda m: str(port + int(m.group(1) or 0)), text)

    out = run_cli(*(filled(a) for a in args))
    assert out.returncode == 2, out.stderr
    assert filled(says) in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_admin_with_no_admin_api_listening_names_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    out = run_cli("admin", "--url", url, "status")
    assert out.returncode == 6, out.stderr
    assert f"no admin API answers at {url}" in out.stderr and "admin.listen" in out.stderr
    assert "Traceback" not in out.stderr and "INFO httpx" not in out.stderr, out.stderr


def test_the_catalog_only_iceberg_actions_need_no_brokers_and_never_create_a_table(tmp_path: Path) -> None:
    tier = tmp_path / "tier"
    tier.mkdir()
    out = run_cli("iceberg", "metadata-location", "--storage", f"file://{tier}")
    assert out.returncode == 1, out.stderr
    assert "no Iceberg table kafka.history in the catalog" in out.stderr and "Traceback" not in out.stderr
    assert not list(tier.rglob("*.metadata.json")), "asking where a table is never creates it"
    out = run_cli("iceberg", "snapshot-at", "--storage", f"file://{tier}", "--topic", "orders", "--offsets",
                  '{"0": 10}')
    assert out.returncode == 1 and "no Iceberg table kafka.history" in out.stderr, out.stderr
    assert not list(tier.rglob("*.metadata.json"))


@pytest.mark.parametrize("offsets", ["nonsense", "[1, 2]", '{"x": "y"}'])
def test_a_bad_offsets_argument_names_the_flag(tmp_path: Path, offsets: str) -> None:
    out = run_cli("iceberg", "snapshot-at", "--storage", f"file://{tmp_path}", "--topic", "orders", "--offsets",
                  offsets)
    assert out.returncode == 2, out.stderr
    assert f"--offsets {offsets!r}: expected a JSON object" in out.stderr and "Traceback" not in out.stderr


def test_a_note_after_a_location_is_refused_naming_it_and_creates_nothing(tmp_path: Path) -> None:
    """`storage=tier  # note`: Kafka's properties format keeps the note in the value (docs/configuration.md); as a
    location it is refused, naming the key and the value (before: the URI's `#` fragment was dropped and the tier
    went to a directory `tier  `, trailing spaces and all)."""
    (tmp_path / "t.properties").write_text(
        f"bootstrap.servers=127.0.0.1:{free_port()}\nstorage=tier  # the tier\nmetadata=file:meta\n")
    out = run_cli("restore", "--dry-run", "-c", str(tmp_path / "t.properties"), cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert "config error: storage: 'tier  # the tier': a location cannot hold '#'" in out.stderr, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.properties"]  # no `tier  `, no `meta`
