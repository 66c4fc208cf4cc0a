"""Commands started as a terminal runs them (a session of their own), stopped by signals, and checked gone: every
process they started, their process group, their ports."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.support.parts import descendants
from tests.support.waiting import wait_until


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def port_free(port: int) -> bool:
    try:
        socket.create_server(("127.0.0.1", port)).close()
    except OSError:
        return False
    return True


class Started:
    """A command in a session of its own (as a terminal's foreground job), its output in a file."""

    def __init__(self, cmd: list[str], out: Path, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        self.out = out
        self.seen: list[int] = []  # every process seen under it: the clean-up's, should the test fail
        with out.open("wb") as sink:
            self.proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
                                         env={**os.environ, **(env or {})}, cwd=cwd)

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def signal_twice(self, sig: signal.Signals, group: bool) -> list[int]:
        """Send `sig` twice, 50 ms apart (to the whole group: a terminal's Ctrl-C); every process under the command
        just before, for the caller to check they are gone."""
        started = [p for p in descendants(self.proc.pid) if alive(p)]
        self.seen += started
        for _ in range(2):
            if group:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)
            time.sleep(0.05)
        return started

    def assert_stopped_cleanly(self, started: list[int], ports: list[int], codes: tuple[int, ...]) -> None:
        rc = self.proc.wait(120)
        text = self.text()
        assert rc in codes and "Traceback" not in text, f"exit {rc}\n{text[-4000:]}"
        deadline = time.monotonic() + 30
        while (left := [p for p in started if alive(p)]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert left == [], [(p, comm(p), pgid(p)) for p in left]
        group = [p for p in map(int, filter(str.isdigit, os.listdir("/proc"))) if alive(p)
                 and pgid(p) == self.proc.pid]
        assert group == [], [(p, comm(p)) for p in group]
        wait_until(lambda: all(port_free(p) for p in ports), f"ports {ports} free", timeout=30)

    def kill(self) -> None:
        for p in [self.proc.pid, *descendants(self.proc.pid), *self.seen]:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        self.proc.wait(10)


def pgid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return -1
