"""A stop signal whose KeyboardInterrupt is raised inside a `__del__` ("Exception ignored in ...") is not lost: the
command would run on, deaf to every later signal (`cli.signals` ignores them while a command stops). CI saw it: a
serve interrupted a second into its start, its interrupt landing in an asyncio transport's `__del__`, served on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


LANDS_IN_EXEC = """
import os, signal, sys
from tierproxy.cli.signals import forget_interrupt_in_exec, stop_on_sigterm
stop_on_sigterm()
try:  # as a dataclass's methods are built at import: code run by exec() of a string
    exec("import os, signal\\nos.kill(os.getpid(), signal.SIGINT)\\nfor i in range(100_000): pass")
except KeyboardInterrupt:
    if sys.argv[1] == "forget":
        forget_interrupt_in_exec()
sys.exit(130)
"""


@pytest.mark.parametrize(("forget", "code"), [("forget", 130), ("keep", -2)])
def test_an_interrupt_caught_after_it_landed_in_exec_exits_with_the_code_main_returns(forget: str, code: int,
                                                                                     tmp_path: Path) -> None:
    """CI saw `serve` Ctrl-C'd in its imports print "stopped by a signal" and still end by SIGINT (-2): CPython
    marks an interrupt raised in exec()'d code as unhandled, caught or not, and a program run as `python -m` (as
    the suite runs the command) ends by it. "keep" shows the mark is real (the premise), "forget" that `main`'s call
    clears it."""
    (tmp_path / "lands_in_exec.py").write_text(LANDS_IN_EXEC)
    out = subprocess.run([sys.executable, "-m", "lands_in_exec", forget], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])})
    assert out.returncode == code, (out.returncode, out.stderr)
