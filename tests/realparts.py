"""Starting the real parts tests need: Kafka, moto S3, kcat. In CI a part that cannot start fails the test."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

from tierproxy.kafkadist import free_port


def unavailable(part: str, reason: str) -> NoReturn:
    """A real part could not start: fail in CI; locally skip only when TIERPROXY_ALLOW_SKIP=1."""
    msg = f"{part} unavailable: {reason}"
    if os.environ.get("CI") or not os.environ.get("TIERPROXY_ALLOW_SKIP"):
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)


@dataclass
class S3Server:
    endpoint: str
    proc: subprocess.Popen[bytes]
    log: Path

    region = "us-east-1"
    access_key = "testing"
    secret_key = "testing"

    def create_bucket(self, name: str) -> None:
        """Create a bucket, and put this server's credentials in the environment (the usual chain)."""
        import asyncio

        from tierproxy.tier.storage import S3Store

        async def run() -> None:
            store = S3Store(name, endpoint=self.endpoint, region=self.region, access_key=self.access_key,
                            secret_key=self.secret_key)
            try:
                await (await store._c()).create_bucket(Bucket=name)
            finally:
                await store.close()

        asyncio.run(run())
        os.environ.update({"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key})


@contextmanager
def moto_server(workdir: Path) -> Iterator[S3Server]:
    """A moto S3 server in a subprocess on a free loopback port (a subprocess so tests can stop it)."""
    port = free_port()
    log = workdir / "moto.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=out, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(endpoint + "/moto-api/", timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    unavailable("moto S3 server", log.read_text(errors="replace")[-2000:])
                time.sleep(0.1)
        yield S3Server(endpoint, proc, log)
    finally:
        proc.terminate()
        proc.wait(10)


def kcat_path() -> str:
    path = shutil.which("kcat") or shutil.which("kafkacat")
    if path is None:
        unavailable("kcat", "not on PATH (make test installs the Debian package kcat)")
    return path


def wait_port(port: int, timeout: float = 10.0, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {host}:{port}")


class ProxyProcess:
    """`tierproxy serve` in a subprocess on free loopback ports, its log in a file."""

    def __init__(self, bootstrap: str, workdir: Path, extra: dict[str, str] | None = None,
                 args: list[str] | None = None) -> None:
        self.port = free_port()
        self.base = free_port_block(100)
        self.log = workdir / f"tierproxy-{self.port}.log"
        env = dict(os.environ)
        env.update({"TIERPROXY_BROKER_PORT_BASE": str(self.base), "TIERPROXY_BROKER_PORT_RANGE": "100",
                    "TIERPROXY_STORAGE": f"file://{workdir}/tier-{self.port}",
                    "TIERPROXY_METADATA": f"file://{workdir}/meta-{self.port}"})
        env.update(extra or {})
        cmd = [sys.executable, "-m", "tierproxy.cli", "--log-level", "DEBUG" if os.environ.get("TP_DEBUG") else "INFO",
               "serve", "--bootstrap-server", bootstrap, "--listen", f"127.0.0.1:{self.port}", *(args or [])]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            wait_port(self.port, 20)
        except TimeoutError:
            self.stop()
            unavailable("tierproxy serve", self.log.read_text(errors="replace")[-3000:])

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return int(self.proc.returncode)


def free_port_block(n: int) -> int:
    """The first of `n` consecutive free loopback ports, below the kernel's ephemeral range (client sockets never
    land there) and bound the way the proxy binds (SO_REUSEADDR)."""
    import random

    low, _ = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    for _ in range(200):
        base = random.randrange(10000, max(10001, low - n))
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no block of {n} free ports")

