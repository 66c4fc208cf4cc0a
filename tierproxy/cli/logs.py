"""How the `tierproxy` command logs: one format, the chatty libraries quieted, and py4j's records one line each.

py4j (Spark's bridge to its JVM) logs every broken call with a traceback, some through the root logger and at INFO:
when the JVM is stopped under it (Ctrl-C reaches the whole process group) a clean stop would print screens of
them. A tierproxy log shows no traceback from it: its records keep their level and message, the exception is
named on the same line, and its INFO chatter is dropped unless the log level asks for DEBUG.
"""

from __future__ import annotations

import logging
import os
import sys

_PY4J_DIR = f"{os.sep}py4j{os.sep}"


def configure(level: str, worker: str | None = None) -> None:
    """Log to stderr at `level`; `worker` names which of `serve --workers N` speaks."""
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s {f'[worker {worker}] ' if worker else ''}%(name)s: "
                        f"%(message)s")
    root = logging.getLogger()
    for chatty in ("aiobotocore", "botocore"):  # "Found credentials in environment variables" on every start
        logging.getLogger(chatty).setLevel(max(logging.WARNING, root.level))
    for handler in root.handlers:
        if not any(isinstance(f, Py4jOneLine) for f in handler.filters):
            handler.addFilter(Py4jOneLine())


class Py4jOneLine(logging.Filter):
    """py4j's records without their tracebacks (see the module's docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not (record.name.startswith("py4j") or _PY4J_DIR in record.pathname):
            return True
        if record.levelno < logging.WARNING and not logging.getLogger().isEnabledFor(logging.DEBUG):
            return False
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            record.msg = f"{record.getMessage()} ({type(exc).__name__}: {exc})"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True
