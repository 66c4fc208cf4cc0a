"""Kafka-style properties files (`--config`, `--command-config`): the one reader, a leaf both the settings and
tierproxy's own identity use."""

from __future__ import annotations

import logging
import re
from pathlib import Path

log = logging.getLogger("tierproxy.config")
TRAILING_COMMENT = re.compile(r"\s[#!]")  # "value   # note": the note is part of the value in Kafka's format


class ConfigError(ValueError):
    """A configuration key has a bad value (or is unknown); the message names the key and the reason."""


def read_properties(path: Path) -> dict[str, str]:
    """Kafka-style properties: key=value (or key: value) per line, '#' and '!' comments, a line ending in a
    backslash continues on the next (as JAAS configs are often written).

    As in Kafka's own files (java.util.Properties), a comment is a whole line: `key=value  # note` gives the value
    `value  # note`. Such a line is kept as Kafka keeps it, with a warning naming the file, line and key (never
    the value: it may be a secret)."""
    out: dict[str, str] = {}
    pending = ""
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = pending + raw.strip() if pending else raw.strip()
        if not pending and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            pending = line[:-1] + " "
            continue
        pending = ""
        sep = min((i for i in (line.find("="), line.find(":")) if i > 0), default=-1)
        if sep < 0:
            raise ConfigError(f"{path}:{n}: expected key=value, got {line!r}")
        key, value = line[:sep].strip(), line[sep + 1:].strip()
        if TRAILING_COMMENT.search(value):
            log.warning("%s:%d: the value of %s holds ' #' or ' !': in a properties file that is part of the value, "
                        "as Kafka reads it (a comment goes on a line of its own)", path, n, key)
        out[key] = value
    return out
