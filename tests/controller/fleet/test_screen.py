"""One walk over a reading at ingest: NaN/Inf and impossible values stored as missing, each counted."""

from __future__ import annotations

import math

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from controller.fleet.plausible import screen
from protos.gpufleet.v1 import telemetry_pb2 as pb


def test_nan_and_inf_become_missing_in_nested_messages() -> None:
    frame = pb.TelemetryFrame(node="n")
    gpu = frame.gpus.add(index=0, power_watts=math.nan, temperature_celsius=55.0, sm_clock_hz=math.inf)
    frame.host.load1 = -math.inf
    probe = frame.probes.add(probe="gemm", value=700.0)
    probe.during.power_watts = math.nan
    non_finite, labels = screen(frame)
    # each cleared value named by its field (the probe's `during` reading is a GpuSample)
    assert sorted(non_finite) == [
        "GpuSample.power_watts",
        "GpuSample.power_watts",
        "GpuSample.sm_clock_hz",
        "HostSample.load1",
    ]
    assert labels == []
    assert not gpu.HasField("power_watts") and not gpu.HasField("sm_clock_hz")
    assert gpu.temperature_celsius == 55.0
    assert not frame.host.HasField("load1")
    assert not frame.probes[0].during.HasField("power_watts")
    assert frame.probes[0].value == 700.0


def test_finite_frame_is_untouched() -> None:
    frame = pb.TelemetryFrame(node="n")
    frame.gpus.add(index=0, power_watts=300.0)
    frame.probes.add(probe="gemm", params={"m": "1"})
    before = frame.SerializeToString()
    assert screen(frame) == ([], [])
    assert frame.SerializeToString() == before


def test_one_walk_clears_both_kinds_and_labels_the_impossible() -> None:
    frame = pb.TelemetryFrame(node="n")
    gpu = frame.gpus.add(index=0, power_watts=math.nan, temperature_celsius=1e9, sm_clock_hz=1.4e9)
    assert screen(frame) == (["GpuSample.power_watts"], ["GpuSample.temperature_celsius"])
    assert not gpu.HasField("power_watts") and not gpu.HasField("temperature_celsius")
    assert gpu.sm_clock_hz == 1.4e9


def _float_paths(
    descriptor: Descriptor, path: tuple[str, ...] = (), seen: frozenset[str] = frozenset()
) -> list[tuple[str, ...]]:
    """Every singular float/double field reachable from `descriptor` (through singular and repeated
    messages, map entries aside), as a path of field names."""
    out = []
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            child = field.message_type
            assert child is not None
            if child.GetOptions().map_entry or child.full_name in seen:
                continue
            out += _float_paths(child, (*path, field.name), seen | {descriptor.full_name})
        elif (
            field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT) and not field.is_repeated
        ):
            out.append((*path, field.name))
    return out


def _set(msg: Message, path: tuple[str, ...], value: float) -> Message:
    """Set the field at `path` (a repeated message gets one element), returning its message."""
    *parents, name = path
    for part in parents:
        field = msg.DESCRIPTOR.fields_by_name[part]
        msg = getattr(msg, part).add() if field.is_repeated else getattr(msg, part)
    setattr(msg, name, value)
    return msg


FRAME_FLOATS = _float_paths(pb.TelemetryFrame.DESCRIPTOR)


def test_every_float_of_a_frame_is_screened_however_deep() -> None:
    """The walk skips message types with nothing to screen; none with a float may be skipped."""
    assert len(FRAME_FLOATS) > 50 and ("probes", "during", "power_watts") in FRAME_FLOATS
    for path in FRAME_FLOATS:
        frame = pb.TelemetryFrame(node="n")
        holder = _set(frame, path, math.nan)
        assert screen(frame)[0] == [f"{holder.DESCRIPTOR.name}.{path[-1]}"], path
        field = holder.DESCRIPTOR.fields_by_name[path[-1]]
        assert not holder.HasField(path[-1]) if field.has_presence else getattr(holder, path[-1]) == 0, path


def test_a_type_with_nothing_to_screen_is_not_walked() -> None:
    """NvLinkSample holds counters and flags only: a frame's 18 links a GPU are not walked."""
    assert not any("nvlinks" in path for path in FRAME_FLOATS)
    frame = pb.TelemetryFrame(node="n")
    frame.gpus.add(index=0).nvlinks.add(link=0, crc_errors_total=2**63)
    assert screen(frame) == ([], [])
