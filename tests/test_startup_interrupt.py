"""A Ctrl-C while a start-up check runs (`serve`'s cluster check, on an event loop of its own): the interrupt goes
on to `main`, which says it in one line; asyncio must not log the check's task, ended by it, as an exception never
retrieved (a traceback under that line: a CI run of `tests/test_signals.py` met it)."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from tierproxy.cli import _failure_of


def test_an_interrupt_inside_a_start_up_check_leaves_no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    async def probe() -> None:
        async def lookup() -> None:  # the check's inner task, where the signal's handler raised
            raise KeyboardInterrupt("signal 2")

        task = asyncio.create_task(lookup())
        await asyncio.sleep(60)  # (interrupted at once)
        await task

    caplog.set_level(logging.DEBUG, logger="asyncio")
    interrupted = False
    try:  # (not pytest.raises: its record of the exception would keep the task alive past the collection below)
        _failure_of(probe)
    except KeyboardInterrupt:
        interrupted = True
    assert interrupted
    gc.collect()  # a task's unretrieved exception is reported when the task is collected
    assert "never retrieved" not in caplog.text and "Traceback" not in caplog.text, caplog.text


def test_a_start_up_check_still_answers_what_it_raised() -> None:
    async def probe() -> None:
        raise ConnectionRefusedError("no broker")

    failure = _failure_of(probe)
    assert isinstance(failure, ConnectionRefusedError) and str(failure) == "no broker"
