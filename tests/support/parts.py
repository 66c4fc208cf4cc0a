"""What starting any real part needs: failing (in CI) when it cannot start, kcat, ports, stopping processes and
what they spawned. S3 servers are in `s3`, the proxy as a process in `proxy`."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, NoReturn

import pytest

from tierproxy.dev import ports


def unavailable(part: str, reason: str) -> NoReturn:
    """A real part could not start: fail in CI; locally skip only when TIERPROXY_ALLOW_SKIP=1."""
    msg = f"{part} unavailable: {reason}"
    if os.environ.get("CI") or not os.environ.get("TIERPROXY_ALLOW_SKIP"):
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)
















def kcat_path() -> str:
    path = shutil.which("kcat") or shutil.which("kafkacat")
    if path is None:
        unavailable("kcat", "not on PATH (make test installs the Debian package kcat)")
    return path


def wait_port(port: int, timeout: float = 10.0, host: str = "127.0.0.1",
              proc: subprocess.Popen[Any] | None = None) -> None:
    """Until something listens on the port; TimeoutError after `timeout` s, at once if `proc` (the server) exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            if proc is not None and proc.poll() is not None:
                raise TimeoutError(f"the server of {host}:{port} exited with {proc.returncode}") from None
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {host}:{port}")




def descendants(pid: int) -> list[int]:
    """Every process under `pid` (children, theirs, ...), parents before children, from /proc."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out: list[int] = []
    todo = [pid]
    while todo:
        for c in children.get(todo.pop(0), []):
            out.append(c)
            todo.append(c)
    return out


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 20) -> int:
    """SIGTERM, then SIGKILL after `timeout` seconds; the exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return int(proc.returncode)


def free_port_block(n: int) -> int:
    """The first of `n` consecutive free loopback ports, below the kernel's ephemeral range (client sockets never
    land there), from this worker's share, and bound the way the proxy binds (SO_REUSEADDR)."""
    return ports.free_port_block(n)

