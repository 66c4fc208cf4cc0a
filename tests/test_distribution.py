"""The distribution's name is ours: `kafka-tierproxy` (the name `tierproxy` on PyPI is another party's, and a user
following the docs would run their code). Every `pip install` in README and docs/ names `kafka-tierproxy`, a
checkout or a wheel built from it, never the bare `tierproxy`; the wheel the README tells how to build is the one
pip builds, and it installs the `tierproxy` command."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from tierproxy.config.distribution import DISTRIBUTION, pip_install

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
WHEEL = f"{DISTRIBUTION.replace('-', '_')}-{PROJECT['version']}-py3-none-any.whl"


def _installs() -> list[tuple[str, str]]:
    """(page, requirement) for every requirement a `pip install` in the docs names (inline or in a code block)."""
    found = []
    for page in PAGES:
        for m in re.finditer(r"pip install ([^`\n]*)", page.read_text()):
            words = shlex.split(m.group(1).split(" #", 1)[0].replace("\\", ""))
            found += [(page.name, w) for w in words if not w.startswith("-")]
    return found


def test_the_docs_install_our_distribution_never_the_bare_name() -> None:
    installs = _installs()
    assert PROJECT["name"] == DISTRIBUTION
    theirs = [(page, w) for page, w in installs if re.match(r"tierproxy(\[|$)", w)]
    assert theirs == [], "pip install of the bare `tierproxy` (another party's distribution on PyPI)"
    readme = [w for page, w in installs if page == "README.md"]
    assert any(w.startswith(DISTRIBUTION) for w in readme), readme  # the published name
    assert ".[tier]" in readme and f"dist/{WHEEL}[tier]" in readme, readme  # a checkout, a wheel built from it
    text = "\n".join(p.read_text() for p in PAGES)
    assert re.findall(r"(?<![\w-])tierproxy\[", text) == [], "an extra of the bare name"
    assert pip_install("tier") == "pip install 'kafka-tierproxy[tier]'"  # what a missing extra's one line says


def test_the_wheel_the_readme_names_is_the_one_pip_builds(tmp_path: Path) -> None:
    src = tmp_path / "src"  # built from a copy: a build in the checkout would leave build/ beside `make image`'s
    for part in ("tierproxy", "protocol"):
        shutil.copytree(ROOT / part, src / part, ignore=shutil.ignore_patterns("__pycache__", "dev"))
    for part in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / part, src / part)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"),
                          str(src)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert [p.name for p in (tmp_path / "dist").iterdir()] == [WHEEL]
    with zipfile.ZipFile(tmp_path / "dist" / WHEEL) as whl:
        info = f"{WHEEL.split('-')[0]}-{PROJECT['version']}.dist-info"
        metadata = whl.read(f"{info}/METADATA").decode()
        scripts = whl.read(f"{info}/entry_points.txt").decode()
    assert f"\nName: {DISTRIBUTION}\n" in metadata
    requires = re.findall(r"^Requires-Dist: ([^\s;]+)", metadata, re.M)
    assert not [r for r in requires if re.match(r"tierproxy\b", r)], requires  # the extras name us, not them
    assert f"{DISTRIBUTION}[tier]" in requires, requires
    assert "tierproxy = tierproxy.cli:main" in scripts  # the command keeps its name
