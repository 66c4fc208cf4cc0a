"""`serve --workers N`: N processes serving the same ports (SO_REUSEPORT), sharing nothing but the ports, the page
cache and the object store; a supervisor above them restarts the one that dies and says why.

Each worker is `tierproxy serve` again (the same arguments) with `_TIERPROXY_WORKER=INDEX/COUNT` and
`_TIERPROXY_WORKER_DIR` in its environment: it serves with its share of the bounds (`ProxySettings.for_worker`), the
first also the admin API, whose `/metrics` adds the others' (`tierproxy.admin.pool`). A worker that dies is started
again with a log line naming its exit (code or signal): at once after a steady run (`STEADY_S`), after 1, 2, 4 .. 30 s
while it keeps dying soon after its start; after `MAX_QUICK_DEATHS` such deaths in a row the supervisor stops every
worker and exits 1. SIGTERM or SIGINT (the first; later ones are
ignored) stops the workers with SIGTERM (each drains as a single `serve` does), SIGKILL for one still running after
its drain and close grace."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("tierproxy.workers")
WORKER_ENV = "_TIERPROXY_WORKER"  # INDEX/COUNT (not TIERPROXY_*: not a setting)
DIR_ENV = "_TIERPROXY_WORKER_DIR"
STEADY_S = 30.0  # a worker that ran this long before it died is restarted at once
MAX_BACKOFF_S = 30.0
MAX_QUICK_DEATHS = 10
PR_SET_PDEATHSIG = 1


def worker_of_environment() -> tuple[int, int, Path] | None:
    """(index, count, metrics directory) when this process is a worker of `serve --workers N`."""
    spec = os.environ.get(WORKER_ENV)
    if not spec:
        return None
    index, _, count = spec.partition("/")
    return int(index), int(count), Path(os.environ[DIR_ENV])


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the supervisor dies, even by SIGKILL (Linux; elsewhere nothing)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Worker:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    quick_deaths: int = 0
    restarts: int = 0
    due: float | None = field(default=0.0)  # when to start it (None: running)


class Supervisor:
    """Starts `count` workers running `argv` (tierproxy's arguments) and keeps them running until a stop signal."""

    def __init__(self, argv: list[str], count: int, stop_grace_s: float) -> None:
        self.argv, self.count, self.stop_grace_s = argv, count, stop_grace_s
        self.workers = [Worker(i) for i in range(count)]
        self.directory = Path(tempfile.mkdtemp(prefix="tierproxy-workers-"))
        self.stopping = False

    def run(self) -> int:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the select below (through the wakeup fd)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_stop)
        log.info("serving with %d workers (SO_REUSEPORT); supervisor pid %d", self.count, os.getpid())
        rc = 0
        try:
            while not self.stopping:
                now = time.monotonic()
                for w in self.workers:
                    if w.due is not None and w.due <= now:
                        self._start(w)
                self._write_metrics()
                dues = [w.due for w in self.workers if w.due is not None]
                timeout = max(0.0, min(dues) - time.monotonic()) if dues else None
                with contextlib.suppress(InterruptedError):
                    if select.select([wake_r], [], [], timeout)[0]:
                        os.read(wake_r, 512)
                if (failed := self._reap()) is not None:
                    rc = failed
                    break
        finally:
            self._stop_all()
            signal.set_wakeup_fd(-1)
            os.close(wake_r)
            os.close(wake_w)
            shutil.rmtree(self.directory, ignore_errors=True)
        log.info("all workers stopped")
        return rc

    def _on_stop(self, signum: int, _frame: object) -> None:
        # the first signal stops; later ones meet a handler that does nothing (as in cli.signals: not SIG_IGN, which
        # reports a signal already on its way as "ignored due to race condition")
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: None)
        log.info("%s: stopping the workers", signal.Signals(signum).name)
        self.stopping = True

    def _start(self, w: Worker) -> None:
        env = {**os.environ, WORKER_ENV: f"{w.index}/{self.count}", DIR_ENV: str(self.directory)}
        w.proc = subprocess.Popen([sys.executable, "-m", "tierproxy.cli", *self.argv], env=env,
                                  preexec_fn=_die_with_parent)
        w.started, w.due = time.monotonic(), None
        log.info("worker %d started (pid %d)", w.index, w.proc.pid)

    def _reap(self) -> int | None:
        """Schedule the restart of each worker that died; an exit code when the pool must stop."""
        for w in self.workers:
            if w.proc is None or (code := w.proc.poll()) is None or self.stopping:
                continue
            pid, ran = w.proc.pid, time.monotonic() - w.started
            w.proc = None
            why = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
            with contextlib.suppress(OSError):  # its counters still count, its gauges no longer
                os.replace(self.directory / f"worker-{w.index}-{pid}.prom",
                           self.directory / f"dead-{w.index}-{pid}.prom")
            w.quick_deaths = w.quick_deaths + 1 if ran < STEADY_S else 0
            if w.quick_deaths >= MAX_QUICK_DEATHS:
                log.error("worker %d (pid %d) %s, its %d death in a row within %.0f s of its start: stopping every "
                          "worker", w.index, pid, why, w.quick_deaths, STEADY_S)
                return 1
            delay = 0.0 if w.quick_deaths == 0 else min(MAX_BACKOFF_S, 2.0 ** (w.quick_deaths - 1))
            w.restarts += 1
            w.due = time.monotonic() + delay
            log.error("worker %d (pid %d) %s after %.1f s; restarting it in %.0f s (restart %d)",
                      w.index, pid, why, ran, delay, w.restarts)
        return None

    def _stop_all(self) -> None:
        running = [w.proc for w in self.workers if w.proc is not None and w.proc.poll() is None]
        for proc in running:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        deadline = time.monotonic() + self.stop_grace_s
        for proc in running:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("worker pid %d still running %.0f s after SIGTERM: SIGKILL", proc.pid, self.stop_grace_s)
                proc.kill()
                proc.wait()

    def _write_metrics(self) -> None:
        lines = ["# HELP tierproxy_workers serve workers configured (serve --workers)",
                 "# TYPE tierproxy_workers gauge", f"tierproxy_workers {self.count}",
                 "# HELP tierproxy_worker_restarts_total Workers started again after they died",
                 "# TYPE tierproxy_worker_restarts_total counter"]
        lines += [f'tierproxy_worker_restarts_total{{worker="{w.index}"}} {w.restarts}' for w in self.workers]
        tmp = self.directory / "supervisor.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, self.directory / "supervisor.prom")
