"""Writes to a pipe in batches: what is sent in one turn of the event loop (or within `delay`) goes in
one write, one system call instead of one per message (the detection process's and the ingest fronts'
pipes carry one message per frame and per ack). Up to VECTOR_PARTS parts go as they are (writelines:
uvloop writes them in one vectored call, asyncio joins them), not joined into a copy first: a frame's
bytes to the detection process are one part (detection/wire.py parts)."""

from __future__ import annotations

import asyncio

FLUSH_BYTES = 1024 * 1024  # this much waiting is written at once, whatever the delay
# At most this many parts in one vectored write (the system takes 1,024 at a time): a batch of more,
# small ones (a front's acks) is cheaper joined than written a thousand pieces at a time.
VECTOR_PARTS = 256


class BatchedWriter:
    """`delay`: how long the first message of a batch waits for others to join its write; 0 (the
    default), until the end of this turn of the loop. A batch of FLUSH_BYTES or more is written at
    once."""

    def __init__(self, transport: asyncio.WriteTransport, *, delay: float = 0.0) -> None:
        self.transport = transport
        self.delay = delay
        self._parts: list[bytes] = []
        self._pending = 0
        self._due: asyncio.Handle | None = None

    def write(self, data: bytes) -> None:
        self._parts.append(data)
        self._pending += len(data)
        if self._pending >= FLUSH_BYTES:
            self.flush()
        elif self._due is None:
            loop = asyncio.get_running_loop()
            if self.delay > 0:
                self._due = loop.call_later(self.delay, self._when_due)
            else:
                self._due = loop.call_soon(self._when_due)

    def _when_due(self) -> None:
        self._due = None  # run: nothing to cancel
        self.flush()

    def flush(self) -> None:
        """Write what waits, now."""
        if self._due is not None:
            self._due.cancel()
            self._due = None
        parts, self._parts, self._pending = self._parts, [], 0
        if parts and not self.transport.is_closing():
            if len(parts) == 1:
                self.transport.write(parts[0])
            elif len(parts) <= VECTOR_PARTS:
                self.transport.writelines(parts)
            else:
                self.transport.write(b"".join(parts))

    def pending_bytes(self) -> int:
        """What waits for its write."""
        return self._pending

    def close(self) -> None:
        """Write what waits, then close the transport."""
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()
