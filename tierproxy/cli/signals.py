"""SIGTERM stops like Ctrl-C in the commands that start other processes (`tier`'s Spark JVM, the demo's broker):
`timeout`, systemd and container runtimes stop with SIGTERM, and Python's default action ends the process at once,
skipping the `finally` blocks that stop the children.

Only the first signal interrupts; later ones are ignored. A second Ctrl-C (or `timeout -s INT` after one) would
otherwise raise KeyboardInterrupt inside those `finally` blocks (a traceback, the children left running), or, once
the interpreter is finalizing and has put the default actions back, end the process by the signal. Ignoring them
cannot hold the process for ever: every stop of a child is bounded (SIGKILL after a grace period).

While the command stops, a later signal meets a Python handler that does nothing, not SIG_IGN: a signal already on
its way when the handler changed would otherwise be reported as "ignored due to race condition", with a traceback.
At the very end (`ignore_stop_signals`) they become SIG_IGN, which finalization leaves alone."""

from __future__ import annotations

import signal
import threading
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def ignore_stop_signals() -> None:
    """From now on SIGINT and SIGTERM are ignored: the command is done (or stopped). SIG_IGN, not a Python handler:
    the interpreter's finalization restores the default action of a signal with a Python handler, never of an
    ignored one."""
    if threading.current_thread() is threading.main_thread():  # (a command run in a thread: not its process)
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


def _ignore(signum: int, frame: FrameType | None) -> None:
    """A stop signal while the command stops already."""


def _interrupt(signum: int, frame: FrameType | None) -> None:
    for sig in STOP_SIGNALS:
        signal.signal(sig, _ignore)
    raise KeyboardInterrupt(f"signal {signum}")


def stop_on_sigterm() -> None:
    """From now on the first SIGTERM or SIGINT raises KeyboardInterrupt in the main thread, and any later one is
    ignored while the command stops what it started."""
    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            signal.signal(sig, _interrupt)
