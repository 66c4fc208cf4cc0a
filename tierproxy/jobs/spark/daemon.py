"""PySpark's worker daemon, importing PySpark from the installed package rather than `pyspark.zip`.

Spark puts `$SPARK_HOME/python/lib/pyspark.zip` (and py4j's) first on its Python workers' path. A zip holds no
compiled bytecode, so every daemon and every worker it forks compiles the PySpark modules it imports from source,
and each task's `importlib.invalidate_caches()` makes the zip importer read the zip's directory again (3.7 MB,
1,000+ entries). Where the same PySpark is installed beside this module (a local master: the executors are the
driver's Python), the zips are taken off the path before PySpark is imported, so its modules load from their cached
bytecode; then PySpark's own daemon runs unchanged. `spark.python.daemon.module` names this module
(`tiering.job.spark_session`: local masters whose workers run this Python). Spark's planner workers (a Python data
source's `partitions()`) keep `pyspark.daemon`: Spark does not let them be configured.

The daemon's workers also collect garbage between tasks without walking, each time, every object the worker keeps
(`CollectThenFreeze`).
"""

from __future__ import annotations

import gc
import os
import sys
from typing import Any


def _installed_pyspark_dir() -> str | None:
    """The directory of an installed PySpark on the path (not a zip), or None."""
    for entry in sys.path:
        if entry.endswith(".zip") or not entry:
            continue
        if os.path.isfile(os.path.join(entry, "pyspark", "daemon.py")):
            return entry
    return None


def strip_spark_zips() -> None:
    """Drop Spark's own zips from `sys.path` when the same PySpark is installed: its modules then come from their
    compiled bytecode. Nothing changes otherwise."""
    zips = [p for p in sys.path if p.endswith(os.sep + "pyspark.zip") or
            (os.path.basename(p).startswith("py4j-") and p.endswith("-src.zip"))]
    if zips and _installed_pyspark_dir() is not None:
        sys.path[:] = [p for p in sys.path if p not in zips]
        for z in zips:  # a cached zip importer would still be asked to re-read its directory on each task
            sys.path_importer_cache.pop(z, None)


class CollectThenFreeze:
    """`gc` as PySpark's daemon sees it. A reused worker runs `gc.collect()` after every task: a full collection
    that walks every object the worker holds (PySpark, PyArrow, pyiceberg and the job's modules, ~75 ms) to free what
    the task left in cycles. Here each collection is followed by `gc.freeze()`: what survived it is set aside, so
    the next one walks only what later tasks made. Every `full_every`-th collection unfreezes first and walks it all,
    so a cycle among older objects that died since is freed too: what tasks leave behind stays bounded."""

    def __init__(self, full_every: int = 100) -> None:
        self.full_every, self.collections = full_every, 0

    def collect(self, generation: int = 2) -> int:
        self.collections += 1
        if self.collections % self.full_every == 0:
            gc.unfreeze()
        found = gc.collect(generation)
        gc.freeze()
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(gc, name)


if __name__ == "__main__":
    strip_spark_zips()
    from pyspark import daemon

    daemon.gc = CollectThenFreeze()  # type: ignore[attr-defined,assignment]  # its `gc.collect()` after each task
    daemon.manager()
