"""SIGTERM stops like Ctrl-C in the commands that start other processes (`tier`'s Spark JVM, the demo's broker):
`timeout`, systemd and container runtimes stop with SIGTERM, and Python's default action ends the process at once,
skipping the `finally` blocks that stop the children.

Only the first signal interrupts; later ones are ignored. A second Ctrl-C (or `timeout -s INT` after one) would
otherwise raise KeyboardInterrupt inside those `finally` blocks (a traceback, the children left running), or, once
the interpreter is finalizing and has put the default actions back, end the process by the signal. Ignoring them
cannot hold the process for ever: every stop of a child is bounded (SIGKILL after a grace period)."""

from __future__ import annotations

import signal
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # SIG_IGN, not a Python handler: the interpreter's finalization restores the default action of a signal with a
    # Python handler, never of an ignored one
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


def stop_on_sigterm() -> None:
    """From now on the first SIGTERM or SIGINT raises KeyboardInterrupt in the main thread, and any later one is
    ignored while the command stops what it started."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _interrupt)
