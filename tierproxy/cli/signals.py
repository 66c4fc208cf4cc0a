"""SIGTERM stops like Ctrl-C in the commands that start other processes (`tier`'s Spark JVM, the demo's broker):
`timeout`, systemd and container runtimes stop with SIGTERM, and Python's default action ends the process at once,
skipping the `finally` blocks that stop the children.

Only the first signal interrupts; later ones are ignored. A second Ctrl-C (or `timeout -s INT` after one) would
otherwise raise KeyboardInterrupt inside those `finally` blocks (a traceback, the children left running), or, once
the interpreter is finalizing and has put the default actions back, end the process by the signal. Ignoring them
cannot hold the process for ever: every stop of a child is bounded (SIGKILL after a grace period).

While the command stops, a later signal meets a Python handler that does nothing, not SIG_IGN: a signal already on
its way when the handler changed would otherwise be reported as "ignored due to race condition", with a traceback.
At the very end (`ignore_stop_signals`) they become SIG_IGN, which finalization leaves alone.

A KeyboardInterrupt raised where Python cannot propagate it (inside a `__del__`, "Exception ignored in ...") would
be lost, and the command would run on deaf to every later signal: it is caught by the unraisable hook and the signal
delivered again, to be raised at the main thread's next step (a few times at most). One raised inside code run by
`exec()` would end the process by SIGINT at exit, whatever `main` returns (`forget_interrupt_in_exec`)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
REDELIVERIES = 5  # a lost interrupt is delivered again at most this often
_lost: list[int] = []  # the signals of interrupts lost in a `__del__`, to be raised again by `_ignore`
_previous_hook = sys.unraisablehook


def ignore_stop_signals() -> None:
    """From now on SIGINT and SIGTERM are ignored: the command is done (or stopped). SIG_IGN, not a Python handler:
    the interpreter's finalization restores the default action of a signal with a Python handler, never of an
    ignored one."""
    if threading.current_thread() is threading.main_thread():  # (a command run in a thread: not its process)
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


def forget_interrupt_in_exec() -> None:
    """Called once a KeyboardInterrupt is caught. CPython marks one raised inside code run by `exec()` of a string
    (dataclasses and namedtuples build their methods so, at import) as unhandled, caught or not, and at exit ends the
    process by SIGINT instead of with its exit code (-2, not 130). Running `exec()` of a string clears the mark
    (`run_eval_code_obj` resets it before each run)."""
    exec("")  # the empty program: nothing runs


def _ignore(signum: int, frame: FrameType | None) -> None:
    """A stop signal while the command stops already; or the first one again, if it was lost (`_unraisable`)."""
    if _lost and len(_lost) <= REDELIVERIES and _lost[-1] == signum:
        _lost.append(-1)  # raised again once; a later signal meets this handler as usual
        raise KeyboardInterrupt(f"signal {signum}")


def _unraisable(args: Any) -> None:
    """Our KeyboardInterrupt raised inside a `__del__` or the like is lost there: deliver its signal again."""
    exc = args.exc_value
    if isinstance(exc, KeyboardInterrupt) and str(exc).startswith("signal ") and len(_lost) < 2 * REDELIVERIES:
        signum = int(str(exc).split()[1])
        _lost.append(signum)
        # sent from a thread a moment later: sent now, its handler would raise inside this hook, lost again
        again = threading.Timer(0.01, os.kill, (os.getpid(), signum))
        again.daemon = True
        again.start()
        return
    _previous_hook(args)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    for sig in STOP_SIGNALS:
        signal.signal(sig, _ignore)
    raise KeyboardInterrupt(f"signal {signum}")


def stop_on_sigterm() -> None:
    """From now on the first SIGTERM or SIGINT raises KeyboardInterrupt in the main thread, and any later one is
    ignored while the command stops what it started."""
    if threading.current_thread() is threading.main_thread():
        sys.unraisablehook = _unraisable
        for sig in STOP_SIGNALS:
            signal.signal(sig, _interrupt)


def _descendants(pid: int) -> list[int]:
    """Every process under `pid`, from /proc (none where there is no /proc)."""
    children: dict[int, list[int]] = {}
    try:
        entries = [d for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return []
    for d in entries:
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out: list[int] = []
    todo = [pid]
    while todo and len(out) < 10_000:
        for c in children.get(todo.pop(0), []):
            out.append(c)
            todo.append(c)
    return out



def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def stop_children(grace_s: float = 10.0) -> None:
    """After a command stopped by a signal: any process it started and did not stop (a child begun in the very
    moment the signal came, as Spark's JVM while a session starts) gets SIGTERM, then SIGKILL after `grace_s`."""
    left = _descendants(os.getpid())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while True:
            for pid in left:  # a child of ours is reaped; another's is its parent's (or init's) to reap
                with contextlib.suppress(OSError):
                    os.waitpid(pid, os.WNOHANG)
            left = [p for p in left if _alive(p)]
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        if not left:
            return
