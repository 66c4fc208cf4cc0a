"""The Helm chart and the tools that check it (helm, built by .ci/install-tools.sh into the project cache)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.parts import unavailable
from tierproxy.dev.maven import cache_dir

CHART = Path(__file__).resolve().parents[2] / "helm" / "tierproxy"


def chart_tool(name: str) -> str:
    path = cache_dir() / "bin" / name
    if not path.exists():
        unavailable(name, f"{path} missing (make install builds it: .ci/install-tools.sh)")
    return str(path)


def render_chart(*args: str) -> str:
    out = subprocess.run([chart_tool("helm"), "template", "demo", str(CHART), *args], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout
