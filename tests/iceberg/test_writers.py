"""Two real `tierproxy iceberg` passes on one table, interleaved at each point (forced with the pause points), and
kill -9 with the default settings: every offset once, every referenced file present, a crash costs one rerun.

Pass A runs in a process of its own (it is stopped, frozen and resumed); pass B runs in this process."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import run_cli
from tests.support.iceberg import Step, pyiceberg_rows, referenced, tier_offsets
from tests.support.kafka import create_topic, fill_topic
from tests.support.tiering import settings, tier_once
from tests.support.waiting import wait_until
from tierproxy.dev.kafkadist import KafkaCluster

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


@pytest.fixture(scope="module")
def tiered(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> tuple[Step, Any]:
    """One tiered topic; each test writes its own table of it."""
    tmp = tmp_path_factory.mktemp("writers")
    topic = f"ice-writers-{os.getpid()}"
    create_topic(kafka.bootstrap, topic)
    fill_topic(kafka.bootstrap, topic, 2000)
    s = settings(kafka.bootstrap, tmp, topic)
    assert tier_once(s).segments >= 3
    return Step(kafka.bootstrap, tmp, topic), s


class PassA:
    """`tierproxy iceberg --once` in its own process group, stopped at a pause point until resumed."""

    def __init__(self, step: Step, table: str, point: str, **env: str) -> None:
        stamp = time.monotonic_ns()
        self.marker, self.resume = step.tmp / f"at-{point}-{stamp}", step.tmp / f"go-{point}-{stamp}"
        self.proc = subprocess.Popen(
            step.cmd("--table", table), cwd=step.tmp, start_new_session=True, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, **step.env(**env), "TIERPROXY_ICEBERG_PAUSE_AT": f"{point}:{self.marker}:{self.resume}"})
        wait_until(lambda: self.marker.exists() or self.proc.poll() is not None, f"pass A at {point}", timeout=240)
        assert self.proc.poll() is None, self.proc.communicate()

    def freeze(self, catalog: Path | None = None) -> None:
        """Stop the whole process, its lease renewal and its Spark JVM (a stall, a long GC). With `catalog` (a
        SQLite file) only while it holds no lock on it: stopped inside a lease renewal's transaction (a write lock)
        or a read (a shared lock, which keeps any writer from committing), it would lock every other pass out of
        the catalog, which is SQLite's rule, not the lease's."""
        for _ in range(50):
            os.killpg(self.proc.pid, signal.SIGSTOP)
            if catalog is None or _unlocked(catalog):
                return
            os.killpg(self.proc.pid, signal.SIGCONT)
            time.sleep(0.1)
        raise AssertionError(f"pass A held a lock on {catalog} at each of 50 tries")

    def thaw(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)

    def finish(self) -> subprocess.CompletedProcess[str]:
        self.resume.touch()
        out, err = self.proc.communicate(timeout=240)
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.communicate(timeout=30)


def _unlocked(catalog: Path) -> bool:
    """Whether no other connection holds any lock on the SQLite file now: an exclusive transaction can begin (then
    rolled back). A write (`BEGIN IMMEDIATE`) can begin beside a reader's shared lock, but not commit past it."""
    con = sqlite3.connect(catalog, timeout=0.5)
    try:
        con.execute("BEGIN EXCLUSIVE")
        con.rollback()
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        con.close()


@contextmanager
def pass_a(step: Step, table: str, point: str, **env: str) -> Iterator[PassA]:
    a = PassA(step, table, point, **env)
    try:
        yield a
    finally:
        a.thaw() if a.proc.poll() is None else None
        a.kill()


def pass_b(step: Step, table: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*step.cmd("--table", table)[3:], env=step.env(**env), cwd=step.tmp, check=False)


def exactly_once(step: Step, s: Any, table: str) -> None:
    t = step.table(table)
    files = referenced(t)
    assert len(files) == len(set(files)), "a data file referenced twice"
    assert all(Path(f.removeprefix("file://")).exists() for f in files), "a referenced file is gone"
    assert [r[4] for r in pyiceberg_rows(t)] == tier_offsets(s, step.topic), "an offset missing or twice"


def test_a_pass_that_planned_before_another_committed_adds_nothing(tiered: tuple[Step, Any]) -> None:
    """A plans; B plans, writes and commits the same segments; A goes on: its lease (a compare-and-swap from
    the snapshot it planned from) is refused, exit 7, nothing of it in the table. Before: A took the lease on
    top of B's commit and added every segment again."""
    step, s = tiered
    with pass_a(step, "kafka.w_plan", "planned") as a:
        b = pass_b(step, "kafka.w_plan")
        assert b.returncode == 0, b.stderr[-2000:]
        done = a.finish()
    assert done.returncode == 7, done.stdout[-2000:] + done.stderr[-2000:]
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("tierproxy:")]
    assert len(lines) == 1 and "since this one planned" in lines[0], done.stderr[-2000:]
    assert "(CommitFailedException: Requirement failed: branch main" in lines[0], lines[0]  # and why
    exactly_once(step, s, "kafka.w_plan")


def test_a_live_writer_is_waited_for_and_a_frozen_one_loses_its_commit(tiered: tuple[Step, Any]) -> None:
    """A has written its files and is about to commit. While it renews its lease B changes nothing (exit 7).
    A freezes past its lease (2 s here): B takes the table over, writes and commits; A thaws and commits — the
    catalog refuses it (the branch moved on since A's snapshot), exit 7, its files left to the orphan rule. Before:
    A's commit landed on top of B's and every record was in the table twice."""
    step, s = tiered
    lease = {"TIERPROXY_ICEBERG_WRITER_LEASE_MS": "2000"}
    with pass_a(step, "kafka.w_commit", "files", **lease) as a:
        busy = pass_b(step, "kafka.w_commit", **lease)
        assert busy.returncode == 7 and "is being written by pass" in busy.stderr, busy.stderr[-2000:]
        catalog = Path(step.uri.removeprefix("sqlite:///"))
        a.freeze(catalog)
        deadline = time.monotonic() + 120
        while (taken := pass_b(step, "kafka.w_commit", **lease)).returncode != 0:  # until A's lease has expired
            assert taken.returncode == 7 and time.monotonic() < deadline, taken.stderr[-2000:]
            if "database is locked" in taken.stderr:  # A stopped holding SQLite's lock after all (ci28, ci30)
                a.thaw()
                a.freeze(catalog)
            time.sleep(0.5)
        assert f"{len(tier_offsets(s, step.topic))} rows added" in taken.stdout, taken.stdout
        a.thaw()
        done = a.finish()
    assert done.returncode == 7, done.stdout[-2000:] + done.stderr[-2000:]
    assert "moved on since this pass planned" in done.stderr, done.stderr[-2000:]
    exactly_once(step, s, "kafka.w_commit")


def test_a_pass_killed_mid_way_costs_one_rerun_with_the_default_settings(tiered: tuple[Step, Any]) -> None:
    """kill -9 after the files are written (the lease left behind) and after the commit, then a rerun at once with
    the default lease and orphan age: it takes the dead pass's lease over (its process is gone) and completes.
    Before: every pass for the next hour said the table was being written by the dead one. Slow (~50-65 s): three
    passes run as processes of their own (a JVM each) to be killed, each followed by a tier pass and a rerun."""
    step, s = tiered
    defaults = {"TIERPROXY_ICEBERG_ORPHAN_MIN_AGE_MS": "3600000"}
    for point in ("files", "planned", "commit"):
        step.killed_at(point, **{**defaults, "TIERPROXY_ICEBERG_TABLE": "kafka.w_kill"})
        again = pass_b(step, "kafka.w_kill", **defaults)
        assert again.returncode == 0, (point, again.stderr[-2000:])
        exactly_once(step, s, "kafka.w_kill")
        fill_topic(step.bootstrap, step.topic, 200)
        assert tier_once(s).segments >= 1
