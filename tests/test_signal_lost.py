"""A stop signal whose KeyboardInterrupt is raised inside a `__del__` ("Exception ignored in ...") is not lost: the
command would run on, deaf to every later signal (`cli.signals` ignores them while a command stops). CI saw it: a
serve interrupted a second into its start, its interrupt landing in an asyncio transport's `__del__`, served on."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.process]

LANDS_IN_DEL = """
import os, signal, time
from tierproxy.cli.signals import stop_on_sigterm
stop_on_sigterm()
class Collected:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs at the next step: inside this __del__
        total = 0
        for i in range(100_000):
            total += i
c = Collected()
del c
try:
    time.sleep(10)
    print("ran on", flush=True)
except KeyboardInterrupt as exc:
    print(f"stopped: {exc}", flush=True)
"""


def test_an_interrupt_raised_inside_a_del_is_delivered_again() -> None:
    out = subprocess.run([sys.executable, "-c", LANDS_IN_DEL], capture_output=True, text=True, timeout=60)
    assert "ran on" not in out.stdout, out.stdout + out.stderr
    assert "stopped: signal 2" in out.stdout or "KeyboardInterrupt" in out.stderr, out.stdout + out.stderr
    assert "Exception ignored" not in out.stderr, out.stderr


LEAVES_A_CHILD = """
import subprocess, sys
from tierproxy.cli.signals import stop_children
child = subprocess.Popen(["sleep", "120"])  # begun as the signal came: nothing else stops it
print(child.pid, flush=True)
stop_children(grace_s=5)
print("alive" if child.poll() is None else "gone", flush=True)
"""


def test_a_child_begun_as_the_signal_came_does_not_outlive_the_command() -> None:
    """`main` stopped by a signal (exit 130) stops whatever the command started and did not stop itself (CI saw
    Spark's JVM, begun in the very moment of a Ctrl-C, outlive `tier`)."""
    out = subprocess.run([sys.executable, "-c", LEAVES_A_CHILD], capture_output=True, text=True, timeout=60)
    pid, state = out.stdout.split()
    assert state == "gone", out.stdout + out.stderr
    assert not os.path.exists(f"/proc/{pid}"), "the child's process is gone, reaped by its parent"
