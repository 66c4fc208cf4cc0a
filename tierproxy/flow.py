"""Flow control: pause a transport's reading for named reasons; resume when no reason is left."""

from __future__ import annotations

import asyncio


class ReadGate:
    """Reading on `transport` is paused while any reason holds (peer slow, too many in flight, draining...)."""

    __slots__ = ("reasons", "transport")

    def __init__(self, transport: asyncio.BaseTransport | None = None) -> None:
        self.transport: asyncio.ReadTransport | None = transport  # type: ignore[assignment]
        self.reasons: set[str] = set()

    def attach(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.reasons and self.transport is not None:
            self.transport.pause_reading()

    def pause(self, reason: str) -> None:
        if not self.reasons and self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
        self.reasons.add(reason)

    def resume(self, reason: str) -> None:
        if reason not in self.reasons:
            return
        self.reasons.discard(reason)
        if not self.reasons and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    @property
    def paused(self) -> bool:
        return bool(self.reasons)
