"""Pause points of the Iceberg step (`tiering.pauses`, under its own variable)."""

from __future__ import annotations

from tierproxy.jobs.tiering.pauses import pause_point as _pause_point

ICEBERG_PAUSE_AT = "TIERPROXY_ICEBERG_PAUSE_AT"


def pause_point(name: str) -> None:
    """TIERPROXY_ICEBERG_PAUSE_AT=name:marker-file[:resume-file] (`tiering.pauses.pause_point`)."""
    _pause_point(name, ICEBERG_PAUSE_AT)
