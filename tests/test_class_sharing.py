"""Class data sharing archives for the run's JVMs (`tierproxy.dev.classshare`): made whole or not at all, used by
the JVMs once made, silently ignored while missing or unusable."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tierproxy.dev import classshare
from tierproxy.dev.kafkadist import KafkaCluster, class_archive


def _java(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["java", *args, "-version"], capture_output=True, text=True, timeout=60)


def test_an_archive_is_made_once_and_a_jvm_can_use_it(tmp_path: Path) -> None:
    path = tmp_path / "cds" / "x.jsa"
    runs: list[list[str]] = []

    def run(dump: list[str]) -> None:
        runs.append(dump)
        assert _java(*dump).returncode == 0

    assert classshare.train(path, run) and path.stat().st_size > 0
    assert classshare.train(path, run) and len(runs) == 1  # there already: not made again
    assert [p.name for p in path.parent.iterdir() if p.suffix == ".tmp"] == []
    strict = _java(f"-XX:SharedArchiveFile={path}", "-Xshare:on")  # -Xshare:on fails on an archive it cannot use
    assert strict.returncode == 0 and "sharing" in strict.stderr, strict.stderr


def test_a_training_that_fails_leaves_nothing_and_says_why(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "cds" / "y.jsa"

    def no_archive(dump: list[str]) -> None:
        assert _java().returncode == 0  # a JVM that exits without the option: nothing written

    def broken(dump: list[str]) -> None:
        raise RuntimeError("the training node did not start")

    assert not classshare.train(path, no_archive) and not path.exists()
    assert not classshare.train(path, broken) and not path.exists()
    assert [p.name for p in path.parent.iterdir() if p.suffix in (".tmp", ".jsa")] == []
    assert "wrote no archive" in caplog.text and "the training node did not start" in caplog.text


def test_a_missing_or_foreign_archive_changes_nothing_a_jvm_prints(tmp_path: Path) -> None:
    plain = _java()
    missing = _java(*classshare.sharing_options(tmp_path / "missing.jsa"))
    foreign = tmp_path / "foreign.jsa"
    foreign.write_bytes(b"\0" * 4096)
    garbage = _java(*classshare.sharing_options(foreign))
    for got in (missing, garbage):
        assert got.returncode == 0 and got.stdout == plain.stdout
        assert "cds" not in got.stderr and "warning" not in got.stderr.lower(), got.stderr


def test_the_archive_key_changes_with_the_class_path_and_the_options() -> None:
    a = classshare.archive_path("k", "/libs/*", ["-XX:TieredStopAtLevel=1"])
    assert a == classshare.archive_path("k", "/libs/*", ["-XX:TieredStopAtLevel=1"])
    assert a != classshare.archive_path("k", "/other/*", ["-XX:TieredStopAtLevel=1"])
    assert a != classshare.archive_path("k", "/libs/*", [])


@pytest.mark.kafka
def test_the_runs_brokers_read_their_classes_from_the_archive(kafka: KafkaCluster) -> None:
    """This run's brokers are started with the archive (made beside the run's start when missing)."""
    assert kafka.nodes[0].proc is not None
    with open(f"/proc/{kafka.nodes[0].proc.pid}/cmdline", "rb") as f:
        args = f.read().decode().split("\0")
    assert f"-XX:SharedArchiveFile={class_archive()}" in args
