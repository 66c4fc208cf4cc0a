"""SIGTERM stops like Ctrl-C in the commands that start other processes (`tier`'s Spark JVM, the demo's broker):
`timeout`, systemd and container runtimes stop with SIGTERM, and Python's default action ends the process at once,
skipping the `finally` blocks that stop the children."""

from __future__ import annotations

import signal
from types import FrameType


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def stop_on_sigterm() -> None:
    """From now on SIGTERM raises KeyboardInterrupt in the main thread, as SIGINT does."""
    signal.signal(signal.SIGTERM, _interrupt)
