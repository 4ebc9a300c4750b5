"""controller/detection/wire.py: a frame's bytes trail its record as they are (parts), and read()
gives the message back whole; a stream that ends inside a record or its trailing bytes reads as its
end; encode() refuses a message whose bytes must trail."""

from __future__ import annotations

import io
import pickle

import pytest

from controller.detection import wire
from controller.fleet.state import FramePlan

PLAN = FramePlan(1.0, 2.0, ((0, {"throttled": 1.0}),), True, None, (), {}, {"GpuSample.power_watts": 1})
FRAME = bytes(range(256)) * 40  # 10 KB, every byte value


def test_a_frames_bytes_trail_its_record_unpickled_and_read_gives_the_message_back() -> None:
    message = ("frame", "node-01", PLAN, FRAME)
    record, trailing = wire.parts(message)
    assert trailing is FRAME  # the very object: not copied
    size = int.from_bytes(record[: wire.HEADER], "big")
    assert pickle.loads(record[wire.HEADER :]) == ("frame", "node-01", PLAN, len(FRAME))
    assert len(record) == wire.HEADER + size < 1000  # the pickle holds no frame
    hello = ("connected", "node-01", True)
    (alone,) = wire.parts(hello)
    assert alone == wire.encode(hello)
    stream = io.BytesIO(b"".join([*wire.parts(message), alone, *wire.parts(("frame", "n2", PLAN, b""))]))
    assert wire.read(stream) == message
    assert wire.read(stream) == hello
    assert wire.read(stream) == ("frame", "n2", PLAN, b"")
    assert wire.read(stream) is None


@pytest.mark.parametrize("cut", [2, 30, -1])
def test_a_stream_that_ends_inside_a_record_or_its_bytes_reads_as_its_end(cut: int) -> None:
    whole = b"".join(wire.parts(("frame", "node-01", PLAN, FRAME)))
    assert wire.read(io.BytesIO(whole[:cut])) is None


def test_encode_refuses_a_message_whose_bytes_must_trail() -> None:
    with pytest.raises(ValueError, match="parts"):
        wire.encode(("frame", "node-01", PLAN, FRAME))
