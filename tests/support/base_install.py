"""`tierproxy` as the base install (`pip install kafka-tierproxy`, no extra) runs it: a process of its own in which
the job dependencies cannot be imported (a `sitecustomize` on PYTHONPATH refuses them, as a venv without them
would), and which records each import it refused."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from tierproxy.cli import EXTRAS

JOB_MODULES = sorted({m.split(".")[0] for _, modules in EXTRAS.values() for m in modules} | {"py4j", "duckdb"})
BLOCKER = '''\
import os, sys
_BLOCKED = {blocked!r}
_LOG = os.environ["BLOCKED_IMPORTS_LOG"]
open(_LOG, "a").write("loaded\\n")
class _Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in _BLOCKED or name == "tierproxy.dev" or name.startswith("tierproxy.dev."):
            open(_LOG, "a").write(name + "\\n")
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, _Refuse())
'''


def without_job_dependencies(tmp: Path) -> dict[str, str]:
    """The environment of a process in which the job dependencies cannot be imported."""
    site = tmp / "no-jobs"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER.format(blocked=JOB_MODULES))
    return {"PYTHONPATH": str(site), "BLOCKED_IMPORTS_LOG": str(tmp / "blocked-imports.log")}


def refused_imports(tmp: Path) -> list[str]:
    """The job modules the processes started with `without_job_dependencies(tmp)` reached for; raises when none
    of them ran with the blocker (then the test proved nothing)."""
    attempts = (tmp / "blocked-imports.log").read_text().split()
    assert "loaded" in attempts, "no process ran without the job dependencies"
    return [a for a in attempts if a != "loaded"]


def run_base(tmp: Path, *args: str, env: Mapping[str, str] | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`tierproxy ARGS` in a fresh interpreter without the job dependencies; `env` added to this process's."""
    full = {**os.environ, **(env or {}), **without_job_dependencies(tmp)}
    return subprocess.run([sys.executable, "-m", "tierproxy.cli", *args], capture_output=True, text=True, env=full,
                          timeout=timeout)


def one_line(out: subprocess.CompletedProcess[str], code: int) -> str:
    """The single line a failed command printed on stderr, after checking its exit code and that it is one line
    without a traceback."""
    lines = out.stderr.strip().splitlines()
    assert out.returncode == code and len(lines) == 1 and "Traceback" not in out.stderr, \
        f"exit {out.returncode} (expected {code}):\n{out.stderr[-3000:]}"
    return lines[0]
