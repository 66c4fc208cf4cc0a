"""Pause points: where a test stops a pass (to kill it -9, or to run something else meanwhile)."""

from __future__ import annotations

import os
import time

TIER_PAUSE_AT = "TIERPROXY_TIER_PAUSE_AT"


def pause_point(name: str, variable: str = TIER_PAUSE_AT) -> None:
    """Where a test stops the job: `variable`=name:marker-file[:resume-file] creates the marker, then waits (up to an
    hour) for the resume file, or for SIGKILL when there is none. Unset (always, outside tests): nothing."""
    point, _, rest = os.environ.get(variable, "").partition(":")
    if point != name:
        return
    marker, _, resume = rest.partition(":")
    with open(marker, "a"):
        pass
    deadline = time.monotonic() + 3600
    while time.monotonic() < deadline and not (resume and os.path.exists(resume)):
        time.sleep(0.05)
