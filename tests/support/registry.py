"""A real Schema Registry for the tests: Apicurio Registry (its Confluent-compatible API at `/apis/ccompat/v7`),
the ready-to-run Quarkus build from Maven Central, on loopback with in-memory storage. Its classes need Java 21+:
the JDK is looked for beside the system's Java in its JVM directory."""

from __future__ import annotations

import re
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support import jvm
from tests.support.parts import stop_process, unavailable
from tierproxy.dev.maven import Artifact, MavenUnavailable, fetch
from tierproxy.dev.ports import free_port

APICURIO_VERSION = "3.3.3"
JVM_DIR = Path("/usr/lib/jvm")


@dataclass
class Registry:
    url: str  # the Confluent-compatible API, what a client's schema.registry.url names
    proc: subprocess.Popen[bytes]
    log: Path


def java_21_or_later() -> str:
    """The `java` of the newest JDK 21+ in the system's JVM directory (by the major version in its name)."""
    found = []
    for home in JVM_DIR.glob("*"):
        if (m := re.search(r"(?:^|[-_.])(\d{2})(?:[-_.]|$)", home.name)) and int(m.group(1)) >= 21 \
                and (home / "bin" / "java").is_file():
            found.append((int(m.group(1)), str(home / "bin" / "java")))
    if not found:
        unavailable("Apicurio Registry", f"no JDK 21 or later in {JVM_DIR} (its classes need Java 21+)")
    return max(found)[1]


def apicurio_home() -> Path:
    """The unpacked Quarkus application (quarkus-run.jar and its lib/), fetched and unpacked once."""
    try:
        archive = fetch(f"apicurio-registry-{APICURIO_VERSION}",
                        Artifact("io.apicurio", "apicurio-registry-app", APICURIO_VERSION, "all", "tar.gz"))
    except MavenUnavailable as exc:
        unavailable("Apicurio Registry", str(exc))
    home = archive.parent / "app"
    if not (home / ".unpacked").exists():
        with tarfile.open(archive) as tar:
            tar.extractall(home, filter="data")
        (home / ".unpacked").touch()
    jars = sorted(home.rglob("quarkus-run.jar"))
    if not jars:
        unavailable("Apicurio Registry", f"no quarkus-run.jar in {archive}")
    return jars[0].parent


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _warm_up(url: str, proc: subprocess.Popen[bytes], log: Path, attempts: int = 10) -> None:
    """Register, read back and list one schema before any test does: the readiness probe answers before the
    Confluent-compatible API has served its first request, and that first request is the slow one."""
    import json

    body = json.dumps({"schema": json.dumps({"type": "string"})}).encode()
    for attempt in range(attempts):
        try:
            req = urllib.request.Request(f"{url}/subjects/warm-up-value/versions", data=body, method="POST",
                                         headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
            with urllib.request.urlopen(req, timeout=30) as r:
                schema_id = json.loads(r.read())["id"]
            with urllib.request.urlopen(f"{url}/schemas/ids/{schema_id}", timeout=30) as r:
                json.loads(r.read())
            with urllib.request.urlopen(f"{url}/subjects", timeout=30) as r:
                json.loads(r.read())
            return
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            if proc.poll() is not None:
                break
            time.sleep(1 + attempt)
    unavailable("Apicurio Registry", "its API never answered a first registration:\n" +
                log.read_text(errors="replace")[-3000:])


@contextmanager
def apicurio_registry(workdir: Path, timeout: float = 180) -> Iterator[Registry]:
    """Apicurio Registry on free loopback ports, ready (its management port's /health/ready answers 200)."""
    java, home = java_21_or_later(), apicurio_home()
    port, management = free_port(), free_port()
    log = workdir / "apicurio.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [java, "-Xmx384m", *jvm.options, "-Dquarkus.http.host=127.0.0.1", f"-Dquarkus.http.port={port}",
             "-Dquarkus.management.host=127.0.0.1", f"-Dquarkus.management.port={management}",
             "-jar", str(home / "quarkus-run.jar")], cwd=home, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while not _ready(f"http://127.0.0.1:{management}/health/ready"):
            if proc.poll() is not None or time.monotonic() > deadline:
                unavailable("Apicurio Registry", log.read_text(errors="replace")[-3000:])
            time.sleep(0.25)
        url = f"http://127.0.0.1:{port}/apis/ccompat/v7"
        _warm_up(url, proc, log)
        yield Registry(url, proc, log)
    finally:
        stop_process(proc, 20)
