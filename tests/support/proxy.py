"""`tierproxy serve` as a process, the way tests run it (its own config file, log, ports)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from tests.support.parts import free_port_block, stop_process, unavailable, wait_port

# what `RemoteService._run` and `_warm` log (tierproxy/remote/service.py): the tier's metadata loaded, then the
# proxy's own connections made ahead of the first remote fetch (or given up on: the first fetch makes them)
_TIER_READY = re.compile(r"remote tier ready: (\d+) partitions")
_CONNECTIONS = ("own connections ready:", "own connections not made ahead")


class ProxyProcess:
    """`tierproxy serve` in a subprocess on free loopback ports, its log in a file."""

    def __init__(self, bootstrap: str, workdir: Path, extra: dict[str, str] | None = None,
                 args: list[str] | None = None) -> None:
        # one block below the ephemeral range (no client socket takes a port before the proxy binds it): the
        # listener, then the 100 broker ports (two blocks picked apart could overlap); never over the admin port
        # the test chose (serve refuses an admin port inside its broker port range)
        listen = {**os.environ, **(extra or {})}.get("TIERPROXY_ADMIN_LISTEN")
        admin_port = int(listen.rsplit(":", 1)[1]) if listen else -1
        for _ in range(20):
            self.port = free_port_block(101)
            if not self.port <= admin_port <= self.port + 100:
                break
        self.base = self.port + 1
        self.log = workdir / f"tierproxy-{self.port}.log"
        env = dict(os.environ)
        env.update({"TIERPROXY_BROKER_PORT_BASE": str(self.base), "TIERPROXY_BROKER_PORT_RANGE": "100",
                    "TIERPROXY_STORAGE": f"file://{workdir}/tier-{self.port}",
                    "TIERPROXY_METADATA": f"file://{workdir}/meta-{self.port}"})
        env.update(extra or {})
        self.admin_url = f"http://{listen}" if listen else None  # set when the test gives the admin API a port
        cmd = [sys.executable, "-m", "tierproxy.cli", "--log-level", "DEBUG" if os.environ.get("TP_DEBUG") else "INFO",
               "serve", "--bootstrap-server", bootstrap, "--listen", f"127.0.0.1:{self.port}", *(args or [])]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            # an interpreter's start and imports take seconds on a machine its tests keep busy: up to 90 s, over at
            # once when the process ends
            wait_port(self.port, 90, proc=self.proc)
        except TimeoutError:
            self.stop()
            unavailable("tierproxy serve", self.log.read_text(errors="replace")[-3000:])

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_tier_ready(self, timeout: float = 90, connections: bool = True) -> None:
        """Until the proxy's tier has loaded its segment metadata (its port opens before) and, with `connections`,
        its own connections to the tiered partitions' leaders are made or given up on (a tier without partitions
        makes none): a bounded poll of its log. AssertionError with the log's tail when the process has ended or
        `timeout` seconds pass (then it is stopped, as a caller without try/finally would leave it running); with
        `--workers`, one worker's lines are enough (each worker loads the tier and logs them)."""
        deadline = time.monotonic() + timeout
        while True:
            # the process first: one that ended is never ready, whatever it logged before
            if self.proc.poll() is not None:
                raise AssertionError(f"tierproxy serve exited with {self.proc.returncode} before its tier was ready "
                                     f"({self.log}):\n{self.log_text()[-3000:]}")
            text = self.log_text()
            ready = _TIER_READY.search(text)
            if ready and (not connections or ready.group(1) == "0" or any(c in text for c in _CONNECTIONS)):
                return
            if time.monotonic() >= deadline:
                self.stop()
                what = "its own connections" if ready else "its tier's metadata"
                raise AssertionError(f"tierproxy serve: {what} not ready after {timeout:.0f}s ({self.log}):\n"
                                     f"{text[-3000:]}")
            time.sleep(0.05)

    def metric(self, name: str) -> float:
        """A metric's value without labels from the admin API's /metrics (0 when it is not there)."""
        import urllib.request

        assert self.admin_url is not None, "give the proxy TIERPROXY_ADMIN_LISTEN"
        with urllib.request.urlopen(self.admin_url + "/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        return 0.0

    def stop(self, timeout: float = 20) -> int:
        return stop_process(self.proc, timeout)
