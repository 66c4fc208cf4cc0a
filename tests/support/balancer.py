"""A fleet as the Helm chart deploys it: `serve` replicas behind an L4 balancer (HAProxy from Debian's package, TCP
mode, round robin, health checks on readyz), a stand-in for a Kubernetes Service.

Every replica advertises the balancer's address and the same broker ports, so a client that bootstraps at the
balancer keeps every connection on it. The replicas listen on their own loopback addresses (127.0.0.2, .3, ...)
with the balancer's port numbers; the balancer listens on 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.support.parts import free_port_block, stop_process, unavailable, wait_port

NODE_PORTS = 4  # broker node ids 0..3 get a port


class Replica:
    """One `tierproxy serve` on 127.0.0.<n>, advertising 127.0.0.1 and the fleet's ports."""

    def __init__(self, n: int, fleet: Fleet) -> None:
        self.n, self.fleet = n, fleet
        self.host = f"127.0.0.{n + 2}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = fleet.workdir / f"replica-{n}.log"

    def start(self) -> None:
        f = self.fleet
        env = {**os.environ, "TIERPROXY_BROKER_PORT_BASE": str(f.base), "TIERPROXY_BROKER_PORT_RANGE": str(NODE_PORTS),
               "TIERPROXY_STORAGE": f.storage, "TIERPROXY_METADATA": f.metadata,
               "TIERPROXY_ADMIN_LISTEN": f"{self.host}:{f.admin}", "TIERPROXY_SHUTDOWN_DRAIN_MS": "5000"}
        cmd = [sys.executable, "-m", "tierproxy.cli", "serve", "--bootstrap-server", f.bootstrap,
               "--listen", f"{self.host}:{f.port}", "--advertised-host", "127.0.0.1"]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            wait_port(f.port, 20, host=self.host)
        except TimeoutError:
            self.stop()
            unavailable("tierproxy serve (replica)", self.log.read_text(errors="replace")[-3000:])

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.fleet.admin}/readyz", timeout=5) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM (drain, then exit); the exit code."""
        assert self.proc is not None
        return stop_process(self.proc, timeout)


class Fleet:
    """`replicas` replicas on one tier and one metadata, behind HAProxy on 127.0.0.1."""

    def __init__(self, bootstrap: str, workdir: Path, storage: str, metadata: str, replicas: int = 2) -> None:
        haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
        if not Path(haproxy).exists():
            unavailable("HAProxy", "no haproxy binary (Debian package haproxy; make install installs it)")
        self.bootstrap, self.workdir, self.storage, self.metadata = bootstrap, workdir, storage, metadata
        block = free_port_block(NODE_PORTS + 2)
        self.port, self.admin, self.base = block, block + 1, block + 2
        self.replicas = [Replica(n, self) for n in range(replicas)]
        cfg = workdir / "haproxy.cfg"
        cfg.write_text(self._config())
        check = subprocess.run([haproxy, "-c", "-f", str(cfg)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        for r in self.replicas:
            r.start()
        self.log = workdir / "haproxy.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([haproxy, "-db", "-f", str(cfg)], stdout=out, stderr=subprocess.STDOUT)
        wait_port(self.port, 10)

    def _config(self) -> str:
        servers = "".join(f"    server r{r.n} {r.host}:{{port}} check port {self.admin} inter 300 fall 2 rise 1\n"
                          for r in self.replicas)
        out = ["global\n    maxconn 4096\n",
               "defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 120s\n    timeout server 120s\n"
               "    retries 3\n    option redispatch\n"]
        for name, port in [("bootstrap", self.port), *((f"node{i}", self.base + i) for i in range(NODE_PORTS))]:
            out.append(f"listen {name}\n    bind 127.0.0.1:{port}\n    balance roundrobin\n"
                       "    option httpchk GET /readyz\n    http-check expect status 200\n"
                       + servers.format(port=port))
        return "\n".join(out)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not all(r.ready() for r in self.replicas):
            assert time.monotonic() < deadline, "replicas not ready: " + " ".join(
                r.log.read_text(errors="replace")[-1500:] for r in self.replicas)
            time.sleep(0.2)

    def close(self) -> None:
        for r in self.replicas:
            if r.proc is not None:
                r.stop()
        self.proc.terminate()
        self.proc.wait(10)
