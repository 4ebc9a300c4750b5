"""fleet/repeated.py each: a repeated field's items for a loop, the very messages of the field (what
screening clears through them is cleared in the frame), and nothing for an empty field."""

from __future__ import annotations

from controller.fleet.plausible import screen
from controller.fleet.repeated import each
from protos.gpufleet.v1 import telemetry_pb2 as pb


def test_each_gives_the_fields_own_items_in_order() -> None:
    frame = pb.TelemetryFrame()
    for index in (3, 1, 2):
        frame.gpus.add(index=index, temperature_celsius=40.0 + index)
    items = each(frame.gpus)
    assert [g.index for g in items] == [3, 1, 2]
    items[1].ClearField("temperature_celsius")  # through the item: the frame's own message
    assert not frame.gpus[1].HasField("temperature_celsius")
    assert frame.gpus[0].temperature_celsius == 43.0


def test_an_empty_field_gives_nothing() -> None:
    sample = pb.GpuSample(index=0)
    assert list(each(sample.xid_events)) == []
    assert list(each(pb.TelemetryFrame().probes)) == []


def test_screening_still_clears_a_reading_inside_a_repeated_field() -> None:
    frame = pb.TelemetryFrame()
    frame.gpus.add(index=0, temperature_celsius=20.0)
    frame.gpus.add(index=1, temperature_celsius=float("nan"))
    event = frame.gpus[1].xid_events.add(code=79, unix_time_seconds=float("inf"))
    non_finite, _ = screen(frame)
    assert non_finite == ["GpuSample.temperature_celsius", "XidEvent.unix_time_seconds"]
    assert not frame.gpus[1].HasField("temperature_celsius")
    assert frame.gpus[0].temperature_celsius == 20.0
    assert event.code == 79 and frame.gpus[1].xid_events[0].unix_time_seconds == 0.0
