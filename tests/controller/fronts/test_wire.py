"""The fronts' pipe records: split and joined at any byte, whatever the payload."""

from __future__ import annotations

import grpc
import pytest

from controller.fronts import wire


def test_records_come_out_whole_however_the_bytes_are_cut() -> None:
    sent = [
        (wire.OPEN, 1, wire.pickled(wire.OPEN, 1, ("ipv4:127.0.0.1:5", {"k": [b"v"]}))[9:]),
        (wire.MSG, 1, b""),  # an empty AgentMessage is a message, not the end
        (wire.MSG, 7, bytes(range(256)) * 60),
        (wire.END, 1, b""),
        (wire.END, 7, b"cancelled"),
    ]
    stream = b"".join(wire.record(kind, sid, payload) for kind, sid, payload in sent)
    for cut in (1, 2, 5, 9, 10, 4096, len(stream)):
        got: list[tuple[int, int, bytes]] = []

        def keep(kind: int, sid: int, payload: bytes, got: list[tuple[int, int, bytes]] = got) -> None:
            got.append((kind, sid, payload))

        records = wire.Records(keep)
        for start in range(0, len(stream), cut):
            records.feed(stream[start : start + cut])
        assert got == sent, cut


@pytest.mark.parametrize(
    "code", [grpc.StatusCode.OK, grpc.StatusCode.ABORTED, grpc.StatusCode.INVALID_ARGUMENT]
)
def test_a_close_carries_the_status_details_and_trailing_metadata(code: grpc.StatusCode) -> None:
    got: list[tuple[int, int, bytes]] = []
    wire.Records(lambda *r: got.append(r)).feed(
        wire.close_record(3, code, "replaced", (("gpufleet-refused-frame", "b1 4"),))
    )
    [(kind, sid, payload)] = got
    value, details, metadata = wire.unpickled(payload)
    assert (kind, sid, wire.status_code(value), details) == (wire.CLOSE, 3, code, "replaced")
    assert metadata == (("gpufleet-refused-frame", "b1 4"),)


def test_held_records_wait_and_come_in_order_on_release() -> None:
    got: list[int] = []

    def on_record(kind: int, sid: int, payload: bytes) -> None:
        got.append(sid)
        if sid == 2:  # as the controller does past its high-water mark
            records.hold()

    records = wire.Records(on_record)
    records.feed(b"".join(wire.record(wire.MSG, sid, b"x" * sid) for sid in range(1, 6)))
    assert got == [1, 2]
    records.feed(wire.record(wire.MSG, 6, b"y"))
    assert got == [1, 2]  # kept, not delivered
    records.release()
    assert got == [1, 2, 3, 4, 5, 6]
