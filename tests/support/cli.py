"""`tierproxy` commands run in the test's own process: the real argument parser, settings loader, job code and
exit codes (`cli.main`'s return value), on the process's Spark session, without a new interpreter and JVM for each.
Tests about the process itself (signals, kill -9, what a fresh interpreter prints or exits with) start it with
`subprocess` instead, and are marked `process`."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path

_SPARK_COMMANDS = {"tier", "iceberg"}
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@contextlib.contextmanager
def environment(changes: Mapping[str, str | None]) -> Iterator[None]:
    """`os.environ` with `changes` (None: removed) for the block, then as it was."""
    saved = {k: os.environ.get(k) for k in changes}
    try:
        for k, v in changes.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _captured_logs(stream: io.StringIO, level: str) -> Iterator[None]:
    """The root logger writing to `stream` at `level` for the block, as `cli.main`'s basicConfig would in a process
    of its own (pytest's own handlers stay)."""
    root = logging.getLogger()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(_FORMAT))
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(level.upper())
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def _log_level(args: list[str]) -> str:
    return args[args.index("--log-level") + 1] if "--log-level" in args[:-1] else "INFO"


def run_cli(*args: str, env: Mapping[str, str | None] | None = None, cwd: Path | None = None,
            check: bool = False) -> subprocess.CompletedProcess[str]:
    """`tierproxy ARGS` in this process: its exit code, what it printed and logged. An exception `main` lets through
    is exit 1 with its traceback on stderr, as in a process of its own; SIGTERM's and SIGINT's handlers are restored
    after."""
    from tierproxy.cli import main

    argv = list(args)
    if _SPARK_COMMANDS & set(argv):
        from tests.support.spark import worker_session

        worker_session()  # the job finds it running and uses it (and never stops it)
    out, err = io.StringIO(), io.StringIO()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    old_cwd = os.getcwd()
    rc: int
    try:
        if cwd is not None:
            os.chdir(cwd)
        with environment(env or {}), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                _captured_logs(err, _log_level(argv)):
            try:
                rc = main(argv)
            except SystemExit as exc:  # argparse's usage errors
                rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except Exception:
                traceback.print_exc(file=sys.stderr)
                rc = 1
    finally:
        os.chdir(old_cwd)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    proc = subprocess.CompletedProcess(["tierproxy", *argv], rc, out.getvalue(), err.getvalue())
    if check:
        assert rc == 0, f"tierproxy {' '.join(argv)} exited {rc}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    return proc
