"""Layers point down only: protocol ← config (with identity), kafka ← tier ← remote, the jobs (jobs/tiering, spark,
iceberg, restore) ← the proxy core (`tierproxy.proxy`) ← admin, cli. No cycle of any kind, between modules or between
packages."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = {"config", "kafka"}  # settings with the identity they describe; tierproxy's own Kafka clients and TLS
CORE = {"proxy"}
# what each layer may import from tierproxy (besides itself, the shared modules and protocol)
ALLOWED: dict[str, set[str]] = {
    "shared": set(),
    "tier": set(),
    "remote": {"tier"},
    "tiering": {"tier"},
    "spark": {"tier", "tiering"},
    "iceberg": {"tier", "tiering", "spark"},
    "restore": {"tier", "tiering"},  # a tier into a new cluster: the tier's model, the job's view of a cluster
    "core": {"tier", "remote"},
    "admin": {"tier", "remote", "core", "iceberg"},
    "cli": {"tier", "remote", "tiering", "core", "admin", "dev", "iceberg", "restore"},
    "dev": set(),  # developer tools, not in the wheel: the Kafka distribution, the Maven resolver, the message
    # generator, the demo
}


def layer_of(module: str) -> str:
    parts = module.split(".")
    head = parts[1] if len(parts) > 1 else ""
    if head == "jobs" and len(parts) > 2:  # each job is a layer of its own
        head = parts[2]
    if head in SHARED:
        return "shared"
    if head in CORE:
        return "core"
    return head


def imports_of(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] if node.module != "tierproxy" else [f"tierproxy.{a.name}" for a in node.names]
            out.update(n for n in names if n.startswith("tierproxy."))
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("tierproxy."))
    return out


def test_every_tierproxy_import_points_down() -> None:
    wrong = []
    for path in sorted((ROOT / "tierproxy").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        if path.name == "spark_entry.py":  # spark-submit's entry point runs the CLI by design
            continue
        mine = layer_of(module)
        assert mine in ALLOWED or module in ("tierproxy.__init__", "tierproxy.jobs.__init__"), module
        for target in imports_of(path):
            theirs = layer_of(target)
            if theirs in (mine, "shared") or theirs in ALLOWED.get(mine, set()):
                continue
            wrong.append(f"{module} ({mine}) imports {target} ({theirs})")
    assert wrong == []


def test_the_remote_service_knows_no_sessions_rewrites_or_metrics() -> None:
    for path in (ROOT / "tierproxy" / "remote").rglob("*.py"):
        bad = {m for m in imports_of(path) if m.split(".")[1] in CORE | {"admin"}}
        assert bad == set(), (path.name, bad)


def test_protocol_imports_nothing_above_it() -> None:
    for path in (ROOT / "protocol").rglob("*.py"):
        assert not any(m.startswith("tierproxy") for m in imports_of(path)), path


def _module_graph() -> dict[str, set[str]]:
    """Every tierproxy module → the tierproxy modules it imports: at the top, inside functions and under
    TYPE_CHECKING alike (an import is an import)."""
    modules = {}
    for path in (ROOT / "tierproxy").rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path

    def known(target: str) -> str:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        out = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tierproxy"):
                out |= {known(f"{node.module}.{a.name}") for a in node.names}
            elif isinstance(node, ast.Import):
                out |= {known(a.name) for a in node.names if a.name.startswith("tierproxy")}
        graph[name] = out - {name, ""}
    return graph


def test_no_import_cycle_of_any_kind() -> None:
    """No module reaches itself through imports (before: config ⇄ identity through a function-level import,
    session ⇄ server through a TYPE_CHECKING one)."""
    graph = _module_graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target):], target])
            elif target not in state:
                visit(target, [*path, target])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def _package_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:3] if parts[1:2] == ["jobs"] else parts[:2])


def test_no_cycle_between_packages() -> None:
    """The packages form a DAG too (config and the identity it describes are one package for that reason): a
    newcomer reads the tree bottom-up."""
    edges: dict[str, set[str]] = {}
    for module, targets in _module_graph().items():
        if module.endswith(".spark_entry"):  # spark-submit's entry point runs the CLI by design
            continue
        edges.setdefault(_package_of(module), set()).update(_package_of(t) for t in targets)
    for package in edges:
        edges[package].discard(package)
    order: list[str] = []
    while edges:
        leaves = sorted(p for p, out in edges.items() if not out & edges.keys())
        assert leaves, f"a cycle among {sorted(edges)}"
        order += leaves
        for p in leaves:
            del edges[p]
    assert order[-1] == "tierproxy.cli" or "tierproxy.dev" in order[-2:]


# `pip install kafka-tierproxy` is the proxy's role (README "Install by role"): these layers import neither the jobs'
# code nor their dependencies (the `tier` and `iceberg` extras), at any depth of a module
PROXY_ROLE = {"shared", "tier", "remote", "core", "admin", "restore"}
JOB_CODE = {"tiering", "iceberg", "spark"}
JOB_DEPENDENCIES = {"pyspark", "py4j", "pyiceberg", "numba", "fastavro", "google", "pyarrow", "numpy", "duckdb"}
# the only ones allowed: the admin API's Iceberg status, imported when asked (it answers 503 naming the extra when
# the extra is missing), and the restore's use of the tier job's Spark-free modules (wire requests to a cluster)
ALLOWED_JOB_IMPORTS = {("tierproxy.admin.status", "tierproxy.jobs.iceberg.status"),
                       ("tierproxy.jobs.restore.run", "tierproxy.jobs.tiering.cluster"),
                       ("tierproxy.jobs.restore.groups", "tierproxy.jobs.tiering.describe")}


def _all_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_the_proxys_packages_import_no_job_code_or_job_dependencies() -> None:
    wrong, allowed = [], set()
    for path in sorted((ROOT / "tierproxy").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        if layer_of(module) not in PROXY_ROLE:
            continue
        for target in _all_imports(path):
            head = target.split(".")[0]
            if head in JOB_DEPENDENCIES or (head == "tierproxy" and layer_of(target) in JOB_CODE):
                if (module, target) in ALLOWED_JOB_IMPORTS:
                    allowed.add((module, target))
                else:
                    wrong.append(f"{module} imports {target}")
    assert wrong == []
    assert allowed == ALLOWED_JOB_IMPORTS, "an allowed import that is gone: take it off the list"
