"""py4j's records in a tierproxy log: one line each, never a traceback (`tierproxy.cli.logs`)."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from tierproxy.cli.logs import Py4jOneLine


@pytest.fixture
def log() -> Iterator[io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(Py4jOneLine())
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield out
    root.removeHandler(handler)
    root.setLevel(level)


def _broken() -> BaseException:
    try:
        raise ConnectionError("Answer from Java side is empty")
    except ConnectionError as exc:
        return exc


def _record(name: str, level: int, msg: str, pathname: str, exc: BaseException | None) -> logging.LogRecord:
    info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord(name, level, pathname, 1, msg, None, info)


def test_an_error_through_the_root_logger_is_one_line_naming_the_exception(log: io.StringIO) -> None:
    # java_gateway.py logs "Exception while sending command." through the root logger itself
    logging.getLogger().handle(_record("root", logging.ERROR, "Exception while sending command.",
                                       "/x/site-packages/py4j/java_gateway.py", _broken()))
    assert log.getvalue() == ("ERROR root: Exception while sending command. "
                              "(ConnectionError: Answer from Java side is empty)\n")


def test_info_chatter_is_dropped_unless_debug(log: io.StringIO) -> None:
    logging.getLogger("py4j.clientserver").info("Error while receiving.", exc_info=_broken())
    assert log.getvalue() == ""
    logging.getLogger().setLevel(logging.DEBUG)
    logging.getLogger("py4j.clientserver").info("Error while receiving.", exc_info=_broken())
    assert log.getvalue() == ("INFO py4j.clientserver: Error while receiving. "
                              "(ConnectionError: Answer from Java side is empty)\n")


def test_other_records_keep_their_traceback(log: io.StringIO) -> None:
    logging.getLogger("tierproxy.tier").error("a pass failed", exc_info=_broken())
    assert "Traceback" in log.getvalue() and "a pass failed" in log.getvalue()
