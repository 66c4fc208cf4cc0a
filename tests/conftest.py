"""Fixtures for the real parts: a session Kafka broker, an on-demand 3-node cluster, S3 (SeaweedFS; moto for
contrast), kcat."""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import itertools
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.jvm import quick_jit, start_training
from tests.support.parts import kcat_path, unavailable
from tests.support.proxy import ProxyProcess
from tests.support.registry import Registry, apicurio_registry
from tests.support.s3 import S3Server, SeaweedSpares, moto_server
from tierproxy.dev import ports
from tierproxy.dev.kafkadist import KafkaCluster, KafkaUnavailable

_clusters: list[KafkaCluster] = []
_proxies: list[ProxyProcess] = []
_names = itertools.count()


def _start(nodes: int, tmp: Path) -> KafkaCluster:
    try:
        cluster = KafkaCluster(nodes, workdir=tmp)
        _clusters.append(cluster)
        return cluster.start()
    except KafkaUnavailable as exc:
        unavailable(f"Apache Kafka ({nodes} node)", str(exc))


def pytest_configure(config: pytest.Config) -> None:
    """The test S3 credentials (SeaweedFS's identity, moto's pair) in the usual AWS chain, before any Spark JVM
    starts: its Python workers inherit its environment."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", S3Server.access_key)
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", S3Server.secret_key)
    first = getattr(config, "workerinput", None) is None  # the run's first process (xdist's controller)
    if not first:  # each worker picks its servers' ports from a share of its own (tierproxy.dev.ports)
        worker = config.workerinput  # type: ignore[attr-defined]
        os.environ[ports.ENV] = ports.worker_share(int(worker["workerid"].removeprefix("gw")),
                                                   int(worker["workercount"]))
    if not _selects_benchmarks(config):
        quick_jit()  # the run's JVMs with C1 alone (tests/support/jvm.py); benchmarks keep the full JIT
        if first and (_selects(config, "kafka") or _selects(config, "spark")):
            try:  # the class sharing archives, made beside the run's first minutes where missing
                start_training(config.rootpath, config.rootpath / ".pytest-artifacts" / "class-sharing.log")
            except Exception as exc:  # an optimisation: the JVMs start without it
                print(f"class sharing archives not trained: {exc}", file=sys.stderr)
    if first:  # the last run's spans go
        for old in (config.rootpath / ".pytest-artifacts").glob("timeline-*.tsv"):
            old.unlink(missing_ok=True)


def _selects(config: pytest.Config, marker: str) -> bool:
    """Whether the run's marker expression selects a test marked `marker` alone."""
    from _pytest.mark.expression import Expression

    expression = config.getoption("markexpr") or ""
    return not expression or Expression.compile(expression).evaluate(lambda name, **_: name == marker)


def _selects_benchmarks(config: pytest.Config) -> bool:
    """Whether the run's marker expression (-m; "not bench" by default) selects benchmarks: a test marked `bench`
    alone, or `bench` and every other marker (`-m bench`, `-m "bench and kafka"`, `-m kafka` all do)."""
    from _pytest.mark.expression import Expression

    expression = config.getoption("markexpr") or ""
    if not expression:
        return True  # no marker expression at all: everything, benchmarks too
    compiled = Expression.compile(expression)
    return compiled.evaluate(lambda name, **_: name == "bench") or compiled.evaluate(lambda name, **_: True)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if "pyspark" in sys.modules:
        from tests.support.spark import stop_worker_session

        stop_worker_session()


PART_MARKERS = {"kafka": "kafka", "proxy": "kafka", "kafka_cluster": "cluster", "s3": "s3", "moto_s3": "s3",
                "spark": "spark", "schema_registry": "registry", "kcat": "kcat", "secured": "kafka",
                "fleet_kafka": "kafka"}


PROCESS_FIXTURES = {"proxy", "tiered_proxy", "served", "fleet"}  # each starts `tierproxy serve` as a process
PROCESS_CALLS = ("ProxyProcess(", "tierproxy.cli", "Fleet(", "run_base(")  # run_base: the base install, a process


def _starts_tierproxy(item: pytest.Item, info: Any) -> bool:
    """The test starts tierproxy as a process (through a fixture, itself, or a helper of its module): marked
    `process`, so a run can leave them out and each is a known candidate for the in-process proxy."""
    fixtures = {name for name, defs in info.name2fixturedefs.items() if defs and defs[-1].func.__name__ == name}
    if PROCESS_FIXTURES & fixtures:
        return True
    function = getattr(item, "function", None)
    module = getattr(item, "module", None)
    if function is None or module is None or getattr(module, "__file__", None) is None:
        return False
    sources = _sources(module.__file__)
    source = sources.get(function.__qualname__)
    if source is None:  # defined elsewhere and imported
        with contextlib.suppress(OSError, TypeError):
            source = inspect.getsource(function)
    calls = PROCESS_CALLS + _starters(module.__file__)
    return source is not None and any(call in source for call in calls)


@functools.cache
def _sources(path: str) -> dict[str, str]:
    """The source of each function of a module by qualified name, from one parse of its file (inspect.getsource
    per test took half of the suite's collection)."""
    text = Path(path).read_text()
    lines = text.splitlines(keepends=True)
    found: dict[str, str] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                found[prefix + node.name] = "".join(lines[first - 1:node.end_lineno])
            elif isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")

    visit(ast.parse(text, path).body, "")
    return found


@functools.cache
def _starters(path: str) -> tuple[str, ...]:
    """`name(` of each function of the module that starts tierproxy as a process."""
    return tuple(f"{name}(" for name, source in _sources(path).items()
                 if "." not in name and not name.startswith("test_") and any(call in source for call in PROCESS_CALLS))


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups (its hook is registered after this file)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist (`--dist loadgroup`), tests sharing a fixture broader than a test and narrower than the session
    (a module's tiered history, a package's secured broker) run on one worker, so that part starts once; tests
    sharing only session parts (the broker, Spark) spread over all workers. A test may name its group itself with
    `@pytest.mark.xdist_group(name)`. The schema registry, a session part that is slow to start and used by a few
    modules, is one group too. A test asking for a real part's fixture gets that part's marker, so the fast lane
    (`make test-fast`: no marker of a real part) holds no such test."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        for name in sorted(set(info.names_closure) & PART_MARKERS.keys()):
            item.add_marker(PART_MARKERS[name])
        if _starts_tierproxy(item, info):
            item.add_marker("process")
        if item.get_closest_marker("xdist_group") is not None:
            continue
        if "schema_registry" in info.names_closure:
            item.add_marker(pytest.mark.xdist_group("schema_registry"))
            continue
        scopes = {d.scope: d for defs in info.name2fixturedefs.values() for d in defs[-1:]}
        for scope in ("package", "module", "class"):
            if scope in scopes:
                where = str(item.path.parent if scope == "package" else item.path)
                # one group per module (package): its fixtures of that scope may be set up once only on one worker
                # (two groups of one module could share a worker and set a module fixture up twice)
                group = f"{Path(where).relative_to(config.rootpath)}::{'package' if scope == 'package' else 'module'}"
                item.add_marker(pytest.mark.xdist_group(group))
                break
    # a stable sort: a module's (a group's) tests keep their order among themselves
    items[:] = sorted(items, key=_heavy_rank)


# the heaviest parts of the suite (worker-seconds in a measured run, `.ci/timeline.py`), started first so that none of
# them runs alone at the end while the other workers idle; the rest keep their collection order
HEAVY_FIRST = ("tests/restore", "schema_registry", "tests/spark/test_dataframe.py", "tests/secured",
               "tests/iceberg/test_lifecycle.py", "tests/tiering/test_s3_gib.py", "tests/proxy/test_faults.py",
               "tests/test_kafka_versions.py", "tests/tiering/test_holes.py", "tests/remote/test_three_brokers.py",
               "tests/fleet", "tests/iceberg/test_table.py", "tests/remote/test_remote_txn_outage.py",
               "tests/iceberg/test_writers.py", "tests/tiering/test_purges.py", "tests/streams",
               "tests/admin/test_admin_api.py",
               "tests/spark/test_worker_python.py", "tests/remote/test_fetch_semantics.py", "tests/test_demo.py",
               "tests/proxy/test_security.py", "tests/remote/test_memory_bound.py", "tests/proxy/test_clients.py",
               "tests/tiering/test_lifecycle.py",
               "tests/test_image.py")  # last of them: it waits for the image build `make test` starts beside the suite


def _group_of(item: pytest.Item) -> str:
    """The test's xdist group ("" for none)."""
    marker = item.get_closest_marker("xdist_group")
    if marker is None:
        return ""
    return str(marker.args[0] if marker.args else marker.kwargs.get("name", ""))


def _heavy_rank(item: pytest.Item) -> int:
    names = [_group_of(item), item.nodeid.split("::")[0]]
    for rank, heavy in enumerate(HEAVY_FIRST):
        if any(name == heavy or name.startswith(heavy + "/") or name.startswith(heavy + "::") for name in names):
            return rank
    return len(HEAVY_FIRST)


def pytest_collection_finish(session: pytest.Session) -> None:
    """On an xdist worker with `--dist loadgroup`, every grouped test's id must carry its group (`@name`): xdist
    groups by that suffix, and a pytest whose ids it cannot change (9.2: pytest-xdist#1386) would spread a module's
    shared parts over every worker without a word."""
    if getattr(session.config, "workerinput", None) is None or not session.config.getvalue("loadgroup"):
        return
    lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if lost:
        raise pytest.UsageError(f"xdist did not group {len(lost)} tests (e.g. {lost[0]}): this pytest's test ids "
                                "cannot carry xdist's group (pytest-xdist#1386); install pytest<9.2")


@pytest.fixture(scope="session")
def spark() -> Any:
    """The process's SparkSession (`tests.support.spark.worker_session`): shared, never stopped by a test."""
    from tests.support.spark import worker_session

    return worker_session()


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """One combined KRaft broker+controller for the whole session."""
    cluster = _start(1, tmp_path_factory.mktemp("kafka"))
    yield cluster
    cluster.stop()


@pytest.fixture
def kafka_cluster(tmp_path: Path) -> Iterator[KafkaCluster]:
    """Three combined KRaft nodes, started for the one test that asks (leader-change tests)."""
    cluster = _start(3, tmp_path / "cluster")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def proxy(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    """`tierproxy serve` in front of the session broker."""
    p = ProxyProcess(kafka.bootstrap, tmp_path_factory.mktemp("proxy"))
    _proxies.append(p)
    yield p
    p.stop()


@pytest.fixture(scope="session")
def seaweedfs_spares(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedSpares]:
    spares = SeaweedSpares(tmp_path_factory.mktemp("seaweedfs"))
    try:
        yield spares
    finally:
        spares.close()


@pytest.fixture
def s3(seaweedfs_spares: SeaweedSpares) -> Iterator[S3Server]:
    """A real S3 implementation: SeaweedFS's S3 gateway (`weed server -s3`) on loopback, one per test, started
    while the test before it ran (`SeaweedSpares`)."""
    with seaweedfs_spares.take() as server:
        yield server


@pytest.fixture
def moto_s3(tmp_path: Path) -> Iterator[S3Server]:
    """moto's S3 emulator: only for the benchmarks' contrast with the real server."""
    with moto_server(tmp_path) as server:
        yield server


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """One Apicurio Registry for the session (in-memory: each test registers under its own subjects)."""
    with apicurio_registry(tmp_path_factory.mktemp("registry")) as registry:
        yield registry


@pytest.fixture(scope="session")
def kcat() -> str:
    return kcat_path()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name unique in the session, readable in broker logs."""
    base = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60]
    return f"{base}-{os.getpid()}-{next(_names)}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    report: pytest.TestReport = yield
    if report.failed and _clusters:
        for cluster in _clusters:
            if any(n.proc is not None for n in cluster.nodes):
                report.sections.append((f"kafka logs {cluster.workdir}", cluster.tail_logs(lines=40)))
        for p in _proxies:
            if p.log.exists():
                report.sections.append((f"tierproxy log {p.log}", "\n".join(p.log_text().splitlines()[-60:])))
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """Each test's span (setup to teardown) on this worker, for `.ci/timeline.py`: which worker carried what, and
    which groups (a module's shared parts) weigh most on the suite's wall time."""
    started = time.time()
    try:
        return (yield)
    finally:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        group = _group_of(item)
        out = item.config.rootpath / ".pytest-artifacts"
        with contextlib.suppress(OSError):
            out.mkdir(exist_ok=True)
            with open(out / f"timeline-{worker}.tsv", "a") as f:
                f.write(f"{started:.3f}\t{time.time():.3f}\t{worker}\t{group}\t{item.nodeid}\n")
