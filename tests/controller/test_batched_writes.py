"""controller/batched_writes.py: what is written in one turn of the loop (or within the writer's
delay) reaches the transport as one write (its parts not joined by us), on either event loop; a
batch past FLUSH_BYTES is written at once; flush() writes what waits and leaves no timer behind to
write again; a closing transport is written nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import pytest

from controller import batched_writes, event_loop
from controller.batched_writes import BatchedWriter
from tests.controller.loops import LOOPS


class Recording(asyncio.WriteTransport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.vectors: list[list[bytes | bytearray | memoryview]] = []  # each writelines' parts
        self.closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        parts = list(list_of_data)
        self.vectors.append(parts)
        super().writelines(parts)  # asyncio's: joined, then write()

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True


@pytest.mark.parametrize("loop", LOOPS)
def test_a_turns_writes_go_as_one_at_its_end(loop: str) -> None:
    async def go() -> None:
        transport = Recording()
        writer = BatchedWriter(transport)
        writer.write(b"ab")
        writer.write(b"c")
        assert transport.writes == [] and writer.pending_bytes() == 3
        await asyncio.sleep(0)
        assert transport.writes == [b"abc"] and writer.pending_bytes() == 0
        writer.write(b"d")
        await asyncio.sleep(0)
        assert transport.writes == [b"abc", b"d"]
        # The parts went as they are, in one writelines (uvloop's: one vectored write), not a join
        # of ours; one part alone is a plain write.
        assert transport.vectors == [[b"ab", b"c"]]

    event_loop.run(go(), loop)


@pytest.mark.parametrize("loop", LOOPS)
def test_with_a_delay_writes_over_several_turns_wait_for_one_write(loop: str) -> None:
    async def go() -> None:
        transport = Recording()
        writer = BatchedWriter(transport, delay=0.2)
        for part in (b"a", b"b", b"c"):
            writer.write(part)
            await asyncio.sleep(0.01)
        assert transport.writes == []
        await asyncio.sleep(0.3)
        assert transport.writes == [b"abc"]

    event_loop.run(go(), loop)


def test_a_batch_of_many_parts_is_joined_into_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batched_writes, "VECTOR_PARTS", 3)

    async def go() -> None:
        transport = Recording()
        writer = BatchedWriter(transport)
        for part in (b"a", b"b", b"c"):
            writer.write(part)
        writer.flush()
        for part in (b"d", b"e", b"f", b"g"):
            writer.write(part)
        writer.flush()
        assert transport.vectors == [[b"a", b"b", b"c"]]  # the second batch: one joined write
        assert transport.writes == [b"abc", b"defg"]

    asyncio.run(go())


def test_a_big_batch_is_written_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batched_writes, "FLUSH_BYTES", 10)

    async def go() -> None:
        transport = Recording()
        writer = BatchedWriter(transport, delay=3600.0)
        writer.write(b"12345")
        assert transport.writes == []
        writer.write(b"67890")
        assert transport.writes == [b"1234567890"]
        assert writer.pending_bytes() == 0

    asyncio.run(go())


@pytest.mark.parametrize("loop", LOOPS)
def test_flush_writes_now_and_its_timer_does_not_write_again(loop: str) -> None:
    async def go() -> None:
        transport = Recording()
        writer = BatchedWriter(transport, delay=0.05)
        writer.write(b"a")
        writer.flush()
        assert transport.writes == [b"a"]
        writer.write(b"b")  # a timer of its own, not the first one's
        await asyncio.sleep(0.01)
        assert transport.writes == [b"a"]
        await asyncio.sleep(0.1)
        assert transport.writes == [b"a", b"b"]
        writer.flush()  # nothing waits: nothing written
        assert transport.writes == [b"a", b"b"]

    event_loop.run(go(), loop)


def test_close_writes_what_waits_and_a_closing_transport_gets_nothing() -> None:
    async def go() -> None:
        transport = Recording()
        writer = BatchedWriter(transport, delay=3600.0)
        writer.write(b"last")
        writer.close()
        assert transport.writes == [b"last"] and writer.is_closing()
        writer.write(b"late")
        writer.flush()
        assert transport.writes == [b"last"]

    asyncio.run(go())
