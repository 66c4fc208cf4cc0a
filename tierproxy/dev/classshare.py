"""Class data sharing archives for the short-lived JVMs of a development machine (Kafka nodes, their storage
format, Spark drivers).

A JVM spends much of its start loading and verifying classes from jars; a dynamic CDS archive
(`-XX:ArchiveClassesAtExit`, JDK 13+) holds those classes as one mapped, pre-parsed file, and a JVM started with
`-XX:SharedArchiveFile` reads them from it. Measured on a Kafka 4.1 node with C1 alone: a node's start 4.7-5.4 →
3.0 CPU-s, its storage format 2.0 → 1.3. An archive is only valid for the JVM build, class path and options it
was made with, so its file name is a hash of those; a JVM handed an archive that is missing or that it cannot use
runs without it (`-Xshare:auto`, its warning silenced), never fails.

An archive is made by a training run (`train`, one at a time per cache), kept in `<cache>/cds/`, and renamed into
place whole: JVMs started before it is there run without it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from tierproxy.dev.maven import cache_dir, locked

log = logging.getLogger("tierproxy.dev.classshare")


def _java_identity() -> str:
    """The JVM build an archive belongs to: the java binary's real path, size and modification time."""
    java = shutil.which("java")
    if java is None:
        return "none"
    real = os.path.realpath(java)
    try:
        jvm = Path(real).parent.parent / "lib" / "server" / "libjvm.so"
        st = (jvm if jvm.exists() else Path(real)).stat()
        return f"{real}:{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        return real


def archive_path(name: str, class_path: str, options: Sequence[str]) -> Path:
    """Where the archive for a JVM of this build, class path and options lives (whether or not it exists)."""
    key = hashlib.sha256("\0".join([_java_identity(), class_path, *options]).encode()).hexdigest()[:16]
    return cache_dir() / "cds" / f"{name}-{key}.jsa"


def sharing_options(path: Path) -> list[str]:
    """Options that make a JVM read its classes from the archive at `path` when it is there and usable, and run
    as it would without one (silently) when it is not: missing, being trained, or made for another JVM."""
    return [f"-XX:SharedArchiveFile={path}", "-Xlog:cds=off,cds+dynamic=off"]


def train(path: Path, run: Callable[[list[str]], None]) -> bool:
    """Make the archive at `path` unless it is there: `run` gets the options that make a JVM write it at its exit,
    and must run such a JVM to a normal exit. Once per cache (a file lock); the archive appears whole or not at
    all (written beside it, then renamed). False, with a log line, when it could not be made."""
    with locked(path.parent):
        if path.exists():
            return True
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            run([f"-XX:ArchiveClassesAtExit={partial}"])
            if not partial.exists() or partial.stat().st_size == 0:
                raise RuntimeError("the training JVM wrote no archive")
            os.replace(partial, path)
        except Exception as exc:  # an optimisation: never a reason for anything else to fail
            log.warning("no class data sharing archive %s: %s", path.name, exc)
            partial.unlink(missing_ok=True)
            return False
    log.info("class data sharing archive %s made", path)
    return True
