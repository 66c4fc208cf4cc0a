"""The Python workers of a local master import PySpark from its installed bytecode, not from Spark's zip, and their
collection between tasks walks only what later tasks made (`tierproxy.jobs.spark.daemon`): each rule without Spark,
then a real session's workers."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tierproxy.jobs.spark.daemon import CollectThenFreeze, strip_spark_zips


def _spark_paths(root: Path) -> tuple[str, str]:
    lib = root / "pyspark" / "python" / "lib"
    return str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")


def test_the_zips_leave_the_path_only_where_pyspark_is_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    zip_, py4j = _spark_paths(tmp_path / "spark")
    site = tmp_path / "site"
    other = str(tmp_path / "elsewhere")
    monkeypatch.setattr(sys, "path", [zip_, py4j, other, str(site)])
    monkeypatch.setattr(sys, "path_importer_cache", {zip_: object(), other: None})
    strip_spark_zips()  # no installed PySpark yet: the zips are its only copy
    assert sys.path == [zip_, py4j, other, str(site)] and zip_ in sys.path_importer_cache
    (site / "pyspark").mkdir(parents=True)
    (site / "pyspark" / "daemon.py").write_text("")
    strip_spark_zips()
    assert sys.path == [other, str(site)]  # the rest of the path, in its order
    assert zip_ not in sys.path_importer_cache and other in sys.path_importer_cache


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_a_collection_between_tasks_frees_the_tasks_cycles_and_sets_the_rest_aside() -> None:
    import weakref

    collector = CollectThenFreeze(full_every=3)
    try:
        kept = _Cycle()  # alive at the first collection: set aside with the rest
        collector.collect()
        assert gc.get_freeze_count() > 0 and collector.isenabled() == gc.isenabled()  # the rest of `gc` as it is
        dropped = _Cycle()  # a task's cycle, made after: freed by the next collection
        gone, older = weakref.ref(dropped), weakref.ref(kept)
        del dropped, kept
        collector.collect()
        assert gone() is None
        assert older() is not None  # set aside: a cycle among older objects waits for the full collection...
        collector.collect()  # ...every third here (100th by default), which walks everything again
        assert older() is None
    finally:
        gc.unfreeze()


@pytest.mark.spark
def test_a_local_sessions_workers_load_pyspark_from_its_bytecode() -> None:
    from tests.support.spark import worker_session

    spark: Any = worker_session()
    assert spark.sparkContext.getConf().get("spark.python.daemon.module") == "tierproxy.jobs.spark.daemon"

    def where(_: Any) -> Any:
        import pyspark

        yield pyspark.__file__, [p for p in sys.path if p.endswith(".zip")], os.environ.get("PYTHONPATH", "")

    [(module, zips, pythonpath)] = spark.sparkContext.parallelize([0], 1).mapPartitions(where).collect()
    assert "pyspark.zip" in pythonpath  # Spark still puts its zip first on the workers' PYTHONPATH...
    assert ".zip" not in module and not any("pyspark.zip" in z for z in zips)  # ...and they import the package


@pytest.mark.spark
def test_a_reused_worker_sets_aside_what_earlier_tasks_left() -> None:
    from tests.support.spark import worker_session

    spark: Any = worker_session()

    def frozen(_: Any) -> Any:
        yield gc.get_freeze_count()

    sc = spark.sparkContext
    counts = [c for _ in range(2) for c in sc.parallelize(range(4), 4).mapPartitions(frozen).collect()]
    assert max(counts) > 0, counts  # a worker that ran a task before froze what survived its collection
