"""The serving loop: every listening socket of a process, every connection, and the
bounds that hold across them (`gas.httpserver.limits`).

One asyncio loop on one thread accepts, shakes hands, reads and writes; requests are
answered on a pool of threads, or on the loop itself for the paths that wait on nothing
(`inline`), so a filter never waits behind binds in the pool's queue. A connection costs a
thread only while one of its requests is answered.

Bounds across connections: at most `max_connections` open (at the bound the longest idle
one is closed for the newcomer; if every one is busy, the newcomer is closed), and at
most `max_buffered_bytes` of request bytes held (past it the connection holding the most
is closed). A sweep four times a second closes connections past their deadlines.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from concurrent.futures import Executor

import uvloop

from gas.httpserver.connection import Connection, Listener
from gas.httpserver.limits import Limits
from gas.httpserver.stats import CloseReason, ServingStats

__all__ = ["Front", "new_loop"]

log = logging.getLogger(__name__)

SWEEP_INTERVAL = 0.25
_FLUSH_AT_EXIT = 0.2


def new_loop() -> asyncio.AbstractEventLoop:
    """The serving loop: uvloop's (libuv), whose transports and loop cost a request a
    fifth less CPU than asyncio's own (`benchmarks/http2_framing.py`)."""
    return uvloop.new_event_loop()


class Front:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        limits: Limits,
        pool: Executor,
        stats: ServingStats | None = None,
        inline: frozenset[str] = frozenset(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        limits.check()
        self.loop = loop
        self.limits = limits
        self.pool = pool
        self.stats = stats or ServingStats()
        self.inline = inline
        """POST paths answered on the loop's thread: those that do no I/O."""
        self.now = clock
        self.buffered = 0
        self.stopping = False
        # Insertion order is the order of last progress: the first idle one is the one
        # that has waited longest.
        self._connections: dict[Connection, None] = {}
        self._servers: list[asyncio.base_events.Server] = []

    @property
    def connections(self) -> int:
        return len(self._connections)

    async def listen(self, sock: socket.socket, listener: Listener) -> None:
        sock.setblocking(False)
        server = await self.loop.create_server(
            lambda: Connection(self, listener), sock=sock, backlog=2048
        )
        self._servers.append(server)

    # The connections' calls.

    def add(self, conn: Connection) -> bool:
        """Takes in a new connection, closing the longest idle one at the bound: False
        when every open connection is busy and `conn` was closed instead."""
        if self.stopping:
            self.stats.opened()
            self._connections[conn] = None
            conn.close(CloseReason.SHUTDOWN)
            return False
        if len(self._connections) >= self.limits.max_connections:
            victim = next((c for c in self._connections if c.idle), None)
            self.stats.opened()
            self._connections[conn] = None
            if victim is None:
                conn.close(CloseReason.CONNECTION_LIMIT, "every connection busy")
                return False
            victim.close(CloseReason.CONNECTION_LIMIT)
            return True
        self.stats.opened()
        self._connections[conn] = None
        return True

    def progressed(self, conn: Connection) -> None:
        """`conn` took a request: it goes to the back of the idle order."""
        if conn in self._connections:
            del self._connections[conn]
            self._connections[conn] = None

    def remove(self, conn: Connection, reason: str, detail: str) -> None:
        if conn.held:
            self.buffered -= conn.held
            conn.held = 0
        if self._connections.pop(conn, 0) is None:
            self.stats.close(reason, conn.peer, detail)

    def hold(self, conn: Connection, size: int) -> None:
        """`conn` holds `size` more request bytes; past the process's bound the
        connection holding the most is closed (maybe `conn`)."""
        if conn.closed:
            return  # what it held was let go when it closed
        conn.held += size
        self.buffered += size
        if self.buffered > self.limits.max_buffered_bytes:
            largest = max(self._connections, key=lambda c: c.held, default=conn)
            largest.close(
                CloseReason.BUFFER_LIMIT,
                f"held {largest.held} of {self.buffered} bytes, over the process's "
                f"{self.limits.max_buffered_bytes}",
            )

    def unhold(self, conn: Connection, size: int) -> None:
        size = min(size, conn.held)
        conn.held -= size
        self.buffered -= size

    # The loop.

    def sweep(self) -> None:
        now = self.now()
        for conn in list(self._connections):
            conn.check(now)

    def shutdown(self) -> None:
        """Stops accepting; connections finish the requests they took, then close."""
        if self.stopping:
            return
        self.stopping = True
        for server in self._servers:
            server.close()
        for conn in list(self._connections):
            conn.shutdown()

    async def run(
        self,
        alive: Callable[[], bool],
        tick: Callable[[], None] = lambda: None,
        graceful_timeout: float = 30.0,
    ) -> None:
        """Serves until `alive()` turns False, then shuts down: waits up to
        `graceful_timeout` for the requests taken. `tick` is called on every sweep."""
        while alive():
            await asyncio.sleep(SWEEP_INTERVAL)
            self.sweep()
            tick()
        self.shutdown()
        deadline = self.now() + graceful_timeout
        while self._connections and self.now() < deadline:
            await asyncio.sleep(0.05)
            self.sweep()
            tick()
        for conn in list(self._connections):
            conn.close(CloseReason.SHUTDOWN)
        # The last bytes (answers, GOAWAYs) leave while the loop still runs.
        await asyncio.sleep(_FLUSH_AT_EXIT)
