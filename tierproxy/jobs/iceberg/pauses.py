"""Pause points: where a test stops a pass (to kill it, or to run another pass meanwhile)."""

from __future__ import annotations

import os
import time


def pause_point(name: str) -> None:
    """Where a test stops the step: TIERPROXY_ICEBERG_PAUSE_AT=name:marker-file[:resume-file] creates the marker,
    then waits (up to an hour) for the resume file, or for SIGKILL when there is none."""
    point, _, rest = os.environ.get("TIERPROXY_ICEBERG_PAUSE_AT", "").partition(":")
    if point != name:
        return
    marker, _, resume = rest.partition(":")
    with open(marker, "a"):
        pass
    deadline = time.monotonic() + 3600
    while time.monotonic() < deadline and not (resume and os.path.exists(resume)):
        time.sleep(0.05)
