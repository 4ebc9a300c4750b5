"""What the fleet keeps of a frame holds none of the frame's own messages.

protobuf's upb keeps one arena per parsed message: a submessage kept from a frame (a probe result,
a BMC sample) keeps the whole frame's memory alive. The fleet therefore keeps probe results
serialized and the BMC sample as a copy; a change to the frame afterwards shows nowhere in it.
"""

from __future__ import annotations

import pickle
from dataclasses import fields

from controller.fleet.model import Fleet, ProbeRecord
from controller.fleet.state import apply_frame, apply_hello, plan_frame
from protos.gpufleet.v1 import bmc_pb2
from protos.gpufleet.v1 import telemetry_pb2 as pb

T0 = 1_700_000_000.0


def _frame() -> pb.TelemetryFrame:
    frame = pb.TelemetryFrame(node="n1", boot_id="b1", seq=1)
    frame.time.FromSeconds(int(T0))
    frame.gpus.add(index=0, uuid="GPU-0", temperature_celsius=60.0)
    frame.bmc.CopyFrom(bmc_pb2.BmcSample(power_consumed_watts=5000.0))
    frame.bmc.time.FromSeconds(int(T0))
    result = frame.probes.add(probe="gemm", variant="bf16", gpu=0, value=700.0, unit="TFLOP/s")
    result.peak_ratio = 0.7
    result.time.FromSeconds(int(T0))
    return pb.TelemetryFrame.FromString(frame.SerializeToString())  # parsed, as ingest has it


def test_the_fleet_keeps_copies_not_the_frames_messages() -> None:
    fleet = Fleet()
    apply_hello(fleet, pb.Hello(node="n1", boot_id="b1"), 0, T0)
    frame = _frame()
    write, _ = plan_frame(fleet.nodes["n1"], frame, T0 + 1)
    apply_frame(fleet, write)

    frame.bmc.power_consumed_watts = 1.0
    frame.probes[0].value = 1.0
    frame.probes[0].peak_ratio = 0.01

    node = fleet.nodes["n1"]
    assert node.bmc is not None
    assert node.bmc.power_consumed_watts == 5000.0
    record = fleet.probes[("n1", 0, "gemm", "bf16")]
    assert isinstance(record.data, bytes)
    assert (record.value, record.peak_ratio) == (700.0, 0.7)
    assert (record.result.value, record.result.peak_ratio) == (700.0, 0.7)


def test_a_record_of_a_result() -> None:
    result = pb.ProbeResult(probe="membw", variant="d2d", gpu=3, value=3000.0, unit="GB/s", error="")
    record = ProbeRecord.of("n1", 3, result, T0)
    assert (record.key, record.value, record.unit, record.time) == (
        ("n1", 3, "membw", "d2d"),
        3000.0,
        "GB/s",
        T0,
    )
    assert record.peak_ratio == 0.0  # unset
    assert record.result == result
    copy = record.result
    copy.value = 1.0  # a parsed copy: the record is unchanged
    assert record.result.value == 3000.0


def test_a_record_goes_to_the_detection_process_whole_as_its_fields() -> None:
    record = ProbeRecord("n1", 3, "gemm", "bf16", 700.0, "TFLOP/s", 1000.0, b"\x08\x01", 0.7)
    assert pickle.loads(pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)) == record
    # Its fields as a tuple, every one: no per-record dict of slots on the wire.
    assert record.__reduce__() == (ProbeRecord, tuple(getattr(record, f.name) for f in fields(ProbeRecord)))
    assert pickle.loads(pickle.dumps(ProbeRecord("n1", None, "nccl", "", 1.0, "GB/s", 2.0, b""))).gpu is None
    assert pickle.loads(pickle.dumps(record)).ratio == 0.7  # read already: not read again there


def test_a_records_peak_ratio_is_read_from_its_result_once_when_not_known() -> None:
    """A record loaded from the store comes without its peak_ratio: the first ask reads it from the
    result's bytes, later asks (and a copy pickled after) keep it."""
    data = pb.ProbeResult(probe="gemm", variant="bf16", value=700.0, peak_ratio=0.5).SerializeToString()
    record = ProbeRecord("n1", 0, "gemm", "bf16", 700.0, "TFLOP/s", 1000.0, data)
    unread = pickle.loads(pickle.dumps(record))
    assert (record.ratio, unread.ratio) == (None, None)
    assert (record.peak_ratio, record.ratio) == (0.5, 0.5)
    assert pickle.loads(pickle.dumps(record)).ratio == 0.5
    assert unread.peak_ratio == 0.5  # a copy sent unread reads it itself
    record.data = b"garbage that is not read again"
    assert record.peak_ratio == 0.5
