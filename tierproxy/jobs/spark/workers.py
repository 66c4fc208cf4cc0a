"""Spark's Python workers must import tierproxy: checked once per Spark application, with the fix in the message.

Spark runs its Python workers with `spark.pyspark.python` / `PYSPARK_PYTHON` (default `python3`), not with the
interpreter that created the session: a script run with a virtualenv's python, the venv not activated, gets workers
that have no tierproxy, and Spark's own error (`PYTHON_DATA_SOURCE_ERROR ... ModuleNotFoundError`) says nothing of
what to do.
"""

from __future__ import annotations

import sys
from typing import Any

NEEDED = ("tierproxy", "crc32c", "cramjam", "pyarrow", "numpy", "numba")
_checked: set[str] = set()


class WorkerPythonError(RuntimeError):
    """Spark's Python workers cannot import what the tierproxy data source needs."""


def check_worker_python(spark: Any) -> None:
    """Run one tiny task that imports tierproxy and its dependencies on a Python worker; raise
    `WorkerPythonError` naming the workers' interpreter and the fix when it cannot. Once per application."""
    sc = spark.sparkContext
    if sc.applicationId in _checked:
        return
    needed = NEEDED

    def probe(_: Any) -> Any:  # nested: pickled by value, so the worker needs no tierproxy to run it
        import importlib
        import sys as worker_sys

        missing = []
        for name in needed:
            try:
                importlib.import_module(name)
            except Exception as exc:
                missing.append(f"{name} ({type(exc).__name__}: {exc})")
        yield worker_sys.executable, missing

    configured = sc.pythonExec if getattr(sc, "pythonExec", None) else "python3"
    try:
        interpreter, missing = sc.parallelize([0], 1).mapPartitions(probe).collect()[0]
    except Exception as exc:
        raise WorkerPythonError(f"Spark's Python workers ({configured}) could not run a task: "
                                f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}. {_fix()}") from None
    if missing:
        raise WorkerPythonError(f"Spark's Python workers ({interpreter}) cannot import {'; '.join(missing)}. "
                                f"{_fix()}")
    _checked.add(sc.applicationId)


def _fix() -> str:
    return (f"Set PYSPARK_PYTHON (or spark.pyspark.python) to the interpreter that has tierproxy installed, e.g. "
            f"PYSPARK_PYTHON={sys.executable}, before the SparkSession starts; on a cluster, install tierproxy on "
            "every executor's Python")
