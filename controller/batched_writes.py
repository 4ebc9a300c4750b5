"""Writes to a pipe once per event-loop turn: what is sent in one turn goes in one write, one system
call instead of one per message (the detection process's and the ingest fronts' pipes carry one
message per frame and per ack)."""

from __future__ import annotations

import asyncio


class BatchedWriter:
    def __init__(self, transport: asyncio.WriteTransport) -> None:
        self.transport = transport
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._parts:
            asyncio.get_running_loop().call_soon(self.flush)
        self._parts.append(data)

    def flush(self) -> None:
        parts, self._parts = self._parts, []
        if parts and not self.transport.is_closing():
            self.transport.write(b"".join(parts) if len(parts) > 1 else parts[0])

    def pending_bytes(self) -> int:
        """What waits for this turn's write."""
        return sum(map(len, self._parts))

    def close(self) -> None:
        """Write what waits, then close the transport."""
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()
