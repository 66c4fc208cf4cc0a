"""Flow control: pause a transport's reading for named reasons; resume when no reason is left; one process-wide
byte budget for requests being received."""

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

    def enforce(self) -> None:
        """Pause a transport the loop reads while a reason holds: uvloop starts reading after `connection_made`
        whatever the protocol paused there (asyncio does not)."""
        t = self.transport
        if self.reasons and t is not None and not t.is_closing() and t.is_reading():
            t.pause_reading()

    @property
    def paused(self) -> bool:
        return bool(self.reasons)


class ByteBudget:
    """One process-wide bound on the bytes held by requests being received (Kafka's `queued.max.request.bytes`)
    and by remote responses being assembled.

    A connection may hold `floor` bytes of its own (its staging buffer: small requests never wait); beyond that it
    draws from the budget, before its buffers grow (`charge` is told what its next read allocates). Like Kafka's
    memory pool (`SimpleMemoryPool`, not strict) a growth is granted while any budget is left, so at most one grant
    passes the bound; once it is spent a connection that would grow stops being read (backpressure, not an error)
    and its growth waits until others give bytes back — except the connection that has held budget the longest,
    whose request always grows (as Kafka's whole-size grant, a request under way is never left waiting for bytes
    that only other waiting requests hold). Whatever clients announce or send, buffered requests stay under
    `limit + connections * floor` plus that one growth and one request (up to the max frame size)."""

    def __init__(self, limit: int, floor: int) -> None:
        self.limit = limit
        self.floor = floor
        self.used = 0
        self.pauses = 0  # times a connection was paused for lack of budget
        self.reserved = 0  # of `used`: held for remote responses being assembled
        self._held: dict[int, int] = {}
        self._waiting: dict[int, tuple[ReadGate, int]] = {}  # in arrival order: the gate, the bytes it waits for

    def charge(self, key: int, wanted: int, gate: ReadGate) -> None:
        """Connection `key` holds `wanted` bytes of request buffers, those its next read allocates included.
        Less than before: the rest goes back. More: granted while any budget is left; otherwise reading `gate`
        pauses until the growth is granted (`_wake`)."""
        want = max(0, wanted - self.floor)
        old = self._held.get(key, 0)
        if want < old:
            self._hold(key, want)
            self._wake()
        elif want > old:
            if (self.used < self.limit and not self._waiting) or self._oldest() == key:  # those waiting go first
                self._hold(key, want)
                return
            if key not in self._waiting:
                self.pauses += 1
            self._waiting[key] = (gate, want)
            gate.pause("memory")

    def _hold(self, key: int, want: int) -> None:
        self.used += want - self._held.get(key, 0)
        if want:
            self._held[key] = want
        else:
            self._held.pop(key, None)

    def reserve(self, wanted: int) -> int:
        """Bytes for a response being assembled (remote reads): as much of `wanted` as the bound has left, never
        waiting — what is not granted is read on a later fetch. Give the grant back with `give_back`."""
        granted = max(0, min(wanted, self.limit - self.used))
        self.used += granted
        self.reserved += granted
        return granted

    def give_back(self, granted: int) -> None:
        self.used -= granted
        self.reserved -= granted
        self._wake()

    def release(self, key: int) -> None:
        """The connection is gone."""
        self.used -= self._held.pop(key, 0)
        self._waiting.pop(key, None)
        self._wake()

    def _oldest(self) -> int | None:
        """The connection that has held budget the longest (`_held` keeps the order keys came in): its request is
        always let grow, else connections halfway through requests could wait for each other's bytes forever (a
        single request larger than the bound, too). Kafka grants a request its whole size at once for the same reason.
        """
        return next(iter(self._held), None)

    def _wake(self) -> None:
        """Grant the waiting connections their growth, first come first, while any budget is left; the oldest
        holder's whatever is left."""
        waiting = self._waiting
        oldest = self._oldest()
        if oldest in waiting:
            self._grant(oldest)
        while waiting and self.used < self.limit:
            self._grant(next(iter(waiting)))

    def _grant(self, key: int) -> None:
        gate, want = self._waiting.pop(key)
        self._hold(key, want)
        gate.resume("memory")
