"""The one Maven resolver of the project: artifacts and their runtime dependencies from Maven Central, copied
once into a directory of the project cache (``$TIERPROXY_CACHE`` or ``~/.cache/tierproxy``, outside the
repository) and reused until the list of artifacts changes. Used for the Kafka distribution (`kafkadist`) and by
the tests for Spark's Kafka source and the Iceberg REST catalog."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path


class MavenUnavailable(RuntimeError):
    """Maven is missing or could not resolve the artifacts; the message says why (with Maven's own output)."""


@dataclass(frozen=True)
class Artifact:
    group: str
    artifact: str
    version: str
    classifier: str | None = None
    kind: str = "jar"  # Maven's packaging type (tar.gz, zip for a distribution archive)

    def coordinates(self) -> str:
        return f"{self.group}:{self.artifact}:{self.version}:{self.kind}" + (f":{self.classifier}"
                                                                             if self.classifier else "")

    def xml(self) -> str:
        classifier = f"<classifier>{self.classifier}</classifier>" if self.classifier else ""
        return (f"<dependency><groupId>{self.group}</groupId><artifactId>{self.artifact}</artifactId>"
                f"<version>{self.version}</version>{classifier}</dependency>")


def cache_dir() -> Path:
    """Where Kafka jars and other downloaded parts live (outside the repository)."""
    return Path(os.environ.get("TIERPROXY_CACHE", Path.home() / ".cache" / "tierproxy"))


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """One process at a time in a cache directory (a file lock on `root/.lock`): parallel test workers (and a test
    beside `make install`) may ask for the same artifacts at once, and Maven's copy into one directory is not
    safe to run twice; nor is training one class sharing archive (`dev.classshare`)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def pom(name: str, artifacts: Sequence[Artifact]) -> str:
    deps = "\n    ".join(a.xml() for a in artifacts)
    return ('<project xmlns="http://maven.apache.org/POM/4.0.0">\n  <modelVersion>4.0.0</modelVersion>\n'
            f"  <groupId>tierproxy</groupId><artifactId>{name}</artifactId><version>1</version>"
            f"<packaging>pom</packaging>\n  <dependencies>\n    {deps}\n  </dependencies>\n</project>\n")


def fetch(name: str, artifact: Artifact, timeout: float = 900) -> Path:
    """One artifact alone, without its dependencies (a distribution archive), copied once into `<cache>/<name>/`;
    its path. Raises MavenUnavailable."""
    root = cache_dir() / name
    with locked(root):
        return _fetch(root, artifact, timeout)


def _fetch(root: Path, artifact: Artifact, timeout: float) -> Path:
    done = root / ".complete"
    if done.exists() and (found := root / done.read_text()).is_file():
        return found
    if shutil.which("mvn") is None:
        raise MavenUnavailable(f"mvn not found on PATH: needed to fetch {artifact.coordinates()} from Maven Central")
    root.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mvn", "-q", "-B", "dependency:copy", f"-Dartifact={artifact.coordinates()}",
                           f"-DoutputDirectory={root}"], capture_output=True, text=True, timeout=timeout)
    suffix = f"-{artifact.classifier}" if artifact.classifier else ""
    found = root / f"{artifact.artifact}-{artifact.version}{suffix}.{artifact.kind}"
    if proc.returncode != 0 or not found.is_file():
        raise MavenUnavailable(f"mvn failed fetching {artifact.coordinates()}:\n{proc.stdout[-3000:]}"
                               f"{proc.stderr[-3000:]}")
    done.write_text(found.name)
    return found


def resolve(name: str, artifacts: Sequence[Artifact], timeout: float = 900) -> Path:
    """The directory `<cache>/<name>/libs` holding `artifacts` and their runtime dependencies, resolved once (and
    again when the list changes: a marker holds its hash). Raises MavenUnavailable."""
    root = cache_dir() / name
    text = pom(name, artifacts)
    with locked(root):
        return _resolve(root, name, text, timeout)


def _resolve(root: Path, name: str, text: str, timeout: float) -> Path:
    libs, marker = root / "libs", root / ".complete"
    resolved = hashlib.sha256(text.encode()).hexdigest()[:16]
    if marker.exists() and marker.read_text() == resolved:
        return libs
    if shutil.which("mvn") is None:
        raise MavenUnavailable(f"mvn not found on PATH: needed to resolve {name} from Maven Central")
    root.mkdir(parents=True, exist_ok=True)
    (root / "pom.xml").write_text(text)
    if libs.exists():
        shutil.rmtree(libs)  # a partial earlier run
    cmd = ["mvn", "-q", "-B", "-f", str(root / "pom.xml"), "dependency:copy-dependencies",
           f"-DoutputDirectory={libs}", "-DincludeScope=runtime"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise MavenUnavailable(f"mvn failed resolving {name}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    marker.write_text(resolved)
    return libs
