"""One writer per table: a lease a live pass renews, and commits that go through only from the snapshot planned.

    tierproxy.writer = "<pass id> <started ms> <renewed ms> <host> <pid>"   (table property)

Exactly once rests on the compare-and-swap, not on the lease: every commit of a pass first stages
`AssertRefSnapshotId(main, <the snapshot it planned from>)`, which the catalog checks inside its commit (SQL and
REST catalogs alike); pyiceberg's own retries, which would rebase an append onto a newer snapshot and drop that
requirement, are off for our tables (`commit.retry.num-retries=0`). Taking the lease is such a commit that also
makes a snapshot (an empty append), so of two passes planning from one snapshot only one gets to write; a pass
whose lease was taken over meanwhile fails its commit and adds nothing.

The lease only decides who writes now and protects a writer's uncommitted files from orphan cleanup: it is live
while renewed within `iceberg.writer.lease.ms` (a thread renews it every third of that while the pass writes) and
its process, when on this host, is alive. A killed pass's lease is taken over at once on the same host, after the
lease elsewhere.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tierproxy.jobs.iceberg.ledger import WRITER

log = logging.getLogger(__name__)

RETRIES_OFF = {"commit.retry.num-retries": "0"}  # a failed commit fails: never rebased past our requirement


class PyicebergChanged(RuntimeError):
    """The installed pyiceberg lacks a private field tierproxy uses (those of 0.12, pyproject's pin): a commit is
    never made without the guard or the setting the field stands for."""


def needs(obj: Any, *fields: str) -> None:
    """PyicebergChanged naming the `fields` `obj` (a pyiceberg object) lacks."""
    missing = [f for f in fields if not hasattr(obj, f)]
    if missing:
        from pyiceberg import __version__

        raise PyicebergChanged(f"pyiceberg {__version__}: {type(obj).__name__} has no {', '.join(missing)}: "
                               "tierproxy's Iceberg commits need pyiceberg 0.12 (pyproject.toml's pin)")


@dataclass(frozen=True)
class Lease:
    pass_id: str
    started_ms: int
    renewed_ms: int
    host: str = ""
    pid: int = 0

    def value(self) -> str:
        return f"{self.pass_id} {self.started_ms} {self.renewed_ms} {self.host} {self.pid}"

    @classmethod
    def parse(cls, raw: str) -> Lease | None:
        """A lease property's value (also the older "<pass id> <started ms>"); None when it is not one."""
        parts = raw.split()
        if len(parts) < 2 or not parts[1].isdigit():
            return None
        renewed = int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else int(parts[1])
        pid = int(parts[4]) if len(parts) > 4 and parts[4].isdigit() else 0
        return cls(parts[0], int(parts[1]), renewed, parts[3] if len(parts) > 3 else "", pid)

    @classmethod
    def new(cls, pass_id: str) -> Lease:
        now = int(time.time() * 1000)
        return cls(pass_id, now, now, socket.gethostname(), os.getpid())


def live_lease(table: Any, lease_ms: int) -> Lease | None:
    """The lease of the pass writing the table now; None when there is none, it was not renewed within
    `lease_ms`, or its process on this host is gone."""
    lease = Lease.parse(table.properties.get(WRITER, ""))
    if lease is None or time.time() * 1000 - lease.renewed_ms >= lease_ms:
        return None
    if lease.host == socket.gethostname() and lease.pid and not _alive(lease.pid):
        return None
    return lease


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def require_at(tx: Any, snapshot_id: int | None) -> None:
    """Stage the compare-and-swap: the commit goes through only if the main branch is at `snapshot_id` (None: the
    table has no snapshot). Staged before any update, it is the transaction's one AssertRefSnapshotId."""
    from pyiceberg.table.update import AssertRefSnapshotId

    needs(tx, "_apply")
    tx._apply((), (AssertRefSnapshotId.model_validate({"ref": "main", "snapshot-id": snapshot_id}),))


def require_refs(tx: Any, refs: Any) -> None:
    """Stage a compare-and-swap on every ref of `refs` (name → `SnapshotRef`, main's own staged by `require_at`):
    the commit goes through only if no branch moved and no tag was moved or removed since. pyiceberg keeps one
    requirement per type in a transaction (`Transaction._stage`), so these are appended past it."""
    from pyiceberg.table.update import AssertRefSnapshotId

    needs(tx, "_requirements")
    tx._requirements += tuple(AssertRefSnapshotId.model_validate({"ref": name, "snapshot-id": ref.snapshot_id})
                              for name, ref in refs.items() if name != "main")


def take(table: Any, lease: Lease, at: int | None, summary: dict[str, str]) -> tuple[Any, int]:
    """Take the table for `lease` if its main branch is still at snapshot `at`: one commit setting the lease and
    making an empty snapshot (with `summary`). → the refreshed table and the snapshot this pass now writes from.
    Raises what the catalog raises when another commit came first."""
    return commit_empty(table, at, summary, {WRITER: lease.value()})


def commit_empty(table: Any, at: int | None, summary: dict[str, str], properties: dict[str, str] | None = None
                 ) -> tuple[Any, int]:
    """An empty snapshot (with `summary`, and `properties` set) committed if the main branch is still at `at`:
    a pass that planned before it can no longer commit. → the refreshed table and the new snapshot's id."""
    if table.properties.get("commit.retry.num-retries") != "0":  # read by pyiceberg before the commit: set first
        with table.transaction() as tx:
            tx.set_properties(RETRIES_OFF)
        table = table.refresh()
    with table.transaction() as tx:
        require_at(tx, at)
        tx.set_properties({**(properties or {}), **RETRIES_OFF})
        tx.add_files([], snapshot_properties=summary)
    table = table.refresh()
    return table, table.current_snapshot().snapshot_id


class Renewal:
    """Renews a lease every `every_s` from a thread of its own (on a table it loads itself), while the branch is
    at snapshot `at`; `lost` says why it stopped (another commit came first). The pass's commits are checked by
    their own compare-and-swap either way."""

    def __init__(self, load: Callable[[], Any], lease: Lease, at: int, every_s: float,
                 redact: Callable[[str], str]) -> None:
        self.load, self.lease, self.at, self.every_s = load, lease, at, every_s
        self.redact = redact  # the catalog's errors may quote its URI with a password
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{lease.pass_id}", daemon=True)

    def __enter__(self) -> Renewal:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        from pyiceberg.exceptions import CommitFailedException

        while not self._stop.wait(self.every_s):
            renewed = Lease(self.lease.pass_id, self.lease.started_ms, int(time.time() * 1000), self.lease.host,
                            self.lease.pid)
            try:
                table = self.load()
                with table.transaction() as tx:
                    require_at(tx, self.at)
                    tx.set_properties({WRITER: renewed.value()})
            except CommitFailedException as exc:  # the table moved on: another pass took it
                self.lost = self.redact(str(exc))[:200]
                log.warning("iceberg: pass %s lost its lease: %s", self.lease.pass_id, self.lost)
                return
            except Exception as exc:  # the catalog did not answer: tried again at the next tick
                log.warning("iceberg: lease of pass %s not renewed yet: %s: %s", self.lease.pass_id,
                            type(exc).__name__, self.redact(str(exc))[:200])


def refused(exc: BaseException) -> bool:
    """The catalog said a commit did not go through (another commit came first): nothing of it is applied. Any other
    failure of a commit (a timeout, CommitStateUnknownException) may hide one the catalog applied: the files it
    added must then stay (the orphan rule removes them once no snapshot names them), `made_by` says which."""
    from pyiceberg.exceptions import CommitFailedException

    return isinstance(exc, CommitFailedException)


def made_by(table: Any, key: str, value: str) -> bool:
    """Whether the table's main branch, loaded afresh, holds a snapshot whose summary has `key` = `value` (the commit
    of a pass or a backfill whose answer was lost); False when the catalog cannot tell now."""
    from pyiceberg.table.snapshots import ancestors_of

    try:
        table = table.refresh()
        current = table.current_snapshot()
        return current is not None and any(
            s.summary is not None and s.summary.additional_properties.get(key) == value
            for s in ancestors_of(current, table.metadata))
    except Exception:
        return False
