"""One walk over a reading at ingest: NaN/Inf and impossible values stored as missing, each counted."""

from __future__ import annotations

import math

from controller.fleet.plausible import screen
from protos.gpufleet.v1 import telemetry_pb2 as pb


def test_nan_and_inf_become_missing_in_nested_messages() -> None:
    frame = pb.TelemetryFrame(node="n")
    gpu = frame.gpus.add(index=0, power_watts=math.nan, temperature_celsius=55.0, sm_clock_hz=math.inf)
    frame.host.load1 = -math.inf
    probe = frame.probes.add(probe="gemm", value=700.0)
    probe.during.power_watts = math.nan
    assert screen(frame) == (4, [])
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
    assert screen(frame) == (0, [])
    assert frame.SerializeToString() == before


def test_one_walk_clears_both_kinds_and_labels_the_impossible() -> None:
    frame = pb.TelemetryFrame(node="n")
    gpu = frame.gpus.add(index=0, power_watts=math.nan, temperature_celsius=1e9, sm_clock_hz=1.4e9)
    assert screen(frame) == (1, ["GpuSample.temperature_celsius"])
    assert not gpu.HasField("power_watts") and not gpu.HasField("temperature_celsius")
    assert gpu.sm_clock_hz == 1.4e9
