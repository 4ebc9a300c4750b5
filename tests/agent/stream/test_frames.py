"""Snapshot -> wire: dataclass fields match proto fields by name, None stays unset, frames round-trip."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import typing
from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from agent.config import load
from agent.daemon import Agent
from agent.probes.base import ProbeOutcome
from agent.snapshot import CollectorStatus, Snapshot
from agent.sources.gpu import (
    ComputeProcess,
    GpuInfo,
    GpuReading,
    Inventory,
    NvLinkReading,
    XidCount,
    XidEvent,
)
from agent.sources.host import (
    CpuCoreReading,
    DiskReading,
    HostFacts,
    HostReading,
    InfinibandPortReading,
    NetInterfaceReading,
    PcieAerReading,
)
from agent.sources.sim import SimHost, SimNode
from agent.sources.sim.probes import ModelledProbes
from agent.stream import frames
from protos.gpufleet.v1 import telemetry_pb2 as pb

# Every dataclass frames.py converts, and the message it becomes.
WIRE: dict[type, type[Message]] = {
    GpuInfo: pb.GpuInfo,
    Inventory: pb.Inventory,
    NvLinkReading: pb.NvLinkSample,
    GpuReading: pb.GpuSample,
    HostFacts: pb.HostFacts,
    HostReading: pb.HostSample,
    CpuCoreReading: pb.CpuCoreSample,
    NetInterfaceReading: pb.NetInterfaceSample,
    DiskReading: pb.DiskSample,
    InfinibandPortReading: pb.InfinibandPortSample,
    PcieAerReading: pb.PcieAerSample,
    ProbeOutcome: pb.ProbeResult,
    CollectorStatus: pb.CollectorStatus,
    ComputeProcess: pb.ComputeProcess,
    XidEvent: pb.XidEvent,
    XidCount: pb.XidCount,
}

# Python type -> the proto scalar types it may be copied into.
SCALARS: dict[type, set[int]] = {
    bool: {FieldDescriptor.TYPE_BOOL},
    int: {
        FieldDescriptor.TYPE_UINT32,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_ENUM,  # enum fields hold the enum's number
        FieldDescriptor.TYPE_INT32,
        FieldDescriptor.TYPE_INT64,
    },
    float: {FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT},
    str: {FieldDescriptor.TYPE_STRING},
}

SPECIAL = {(ProbeOutcome, "time")}  # a float on our side, a Timestamp on the wire (frames.probe_result)

NOW = 1_800_000_000.25


def cases() -> list[tuple[type, str]]:
    return [(cls, f.name) for cls in WIRE for f in dataclasses.fields(cls)]


def hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def split_optional(hint: Any) -> tuple[Any, bool]:
    """(the type without None, whether None was allowed)."""
    args = typing.get_args(hint)
    if type(None) in args:
        rest = [a for a in args if a is not type(None)]
        assert len(rest) == 1
        return rest[0], True
    return hint, False


# -- the naming contract ----------------------------------------------------------------------


@pytest.mark.parametrize(("cls", "name"), cases(), ids=[f"{c.__name__}.{n}" for c, n in cases()])
def test_every_field_has_a_same_named_proto_field_of_a_matching_type(cls: type, name: str) -> None:
    descriptor = WIRE[cls].DESCRIPTOR
    assert name in descriptor.fields_by_name, f"{cls.__name__}.{name} has no field in {descriptor.full_name}"
    field = descriptor.fields_by_name[name]
    if (cls, name) in SPECIAL:
        assert field.message_type is Timestamp.DESCRIPTOR
        return
    hint, nullable = split_optional(hints(cls)[name])
    origin = typing.get_origin(hint)
    if origin is list:
        (item,) = typing.get_args(hint)
        assert field.is_repeated
        if item in WIRE:  # a list of dataclasses: a repeated message
            assert field.message_type is WIRE[item].DESCRIPTOR
        else:
            assert field.type in SCALARS[item]
    elif origin is dict:
        assert field.message_type is not None and field.message_type.GetOptions().map_entry
    elif hint in WIRE:  # a nested dataclass: a message
        assert not field.is_repeated and field.message_type is WIRE[hint].DESCRIPTOR
    else:
        assert not field.is_repeated
        assert field.type in SCALARS[hint], f"{cls.__name__}.{name}: {hint} vs proto type {field.type}"
    if nullable:
        # None must be distinguishable from zero on the wire: the proto field needs presence.
        assert field.has_presence, f"{descriptor.full_name}.{name} must be optional (None means not read)"


def test_fill_refuses_a_field_the_message_lacks() -> None:
    @dataclasses.dataclass
    class Renamed:
        index: int
        sm_clock_mhz: float | None = None  # renamed on our side only

    with pytest.raises((ValueError, AttributeError)):
        frames.fill(pb.GpuSample(), Renamed(0, 1410.0))
    assert "sm_clock_mhz" not in pb.GpuSample.DESCRIPTOR.fields_by_name


# -- fill ------------------------------------------------------------------------------------


def sample_value(hint: Any, i: int) -> Any:
    """A distinct non-zero value of type `hint` (seeded by `i`)."""
    hint, _ = split_optional(hint)
    if hint is bool:
        return True
    if hint is int:
        return 1000 + i
    if hint is float:
        return 0.5 + i
    if hint is str:
        return f"s{i}"
    raise AssertionError(hint)


def full(cls: type, *, skip: tuple[str, ...] = ()) -> Any:
    """An instance of dataclass `cls` with every scalar field set to a distinct non-default value."""
    kwargs: dict[str, Any] = {}
    for i, f in enumerate(dataclasses.fields(cls)):
        hint = hints(cls)[f.name]
        if f.name in skip or typing.get_origin(split_optional(hint)[0]) in (list, dict):
            continue
        if dataclasses.is_dataclass(split_optional(hint)[0]):
            continue
        kwargs[f.name] = sample_value(hint, i)
    return cls(**kwargs)


@pytest.mark.parametrize("cls", [GpuInfo, NvLinkReading, GpuReading, HostFacts, HostReading, CollectorStatus])
def test_fill_copies_every_value(cls: type) -> None:
    obj = full(cls)
    msg = frames.fill(WIRE[cls](), obj)
    for f in dataclasses.fields(cls):
        value = getattr(obj, f.name)
        if isinstance(value, (list, dict)):
            continue
        assert getattr(msg, f.name) == value, f.name


def test_none_stays_unset_and_zero_is_kept() -> None:
    msg = frames.fill(pb.GpuSample(), GpuReading(index=0, uuid="GPU-x"))
    assert msg.ListFields() == [(pb.GpuSample.DESCRIPTOR.fields_by_name["uuid"], "GPU-x")]
    optional = [f.name for f in pb.GpuSample.DESCRIPTOR.fields if f.has_presence]
    nullable = {f.name for f in dataclasses.fields(GpuReading) if f.default is None}
    # Worked out by frames.frame from the links, not read: tests/agent/stream/test_link_digest.py.
    nullable |= {"nvlink_errors_digest", "nvlinks_inactive"}
    assert set(optional) == nullable and not any(msg.HasField(n) for n in optional)

    zeros = GpuReading(index=1, uuid="u", power_watts=0.0, row_remap_pending=False, clock_event_reasons=0)
    msg = frames.fill(pb.GpuSample(), zeros)
    assert msg.HasField("power_watts") and msg.HasField("row_remap_pending")
    assert msg.HasField("clock_event_reasons")
    assert not msg.HasField("temperature_celsius")

    host = frames.fill(pb.HostSample(), HostReading(cpu_governor="", load1=0.0))
    assert host.HasField("cpu_governor") and host.HasField("load1")
    assert not host.HasField("uptime_seconds") and not host.HasField("cpu_frequency_hz")

    info = frames.fill(pb.GpuInfo(), GpuInfo(index=0, uuid="u", name="H100"))
    assert not info.HasField("memory_total_bytes") and not info.HasField("nvlink_count")


def test_probe_result_keeps_time_params_and_node_level_gpu() -> None:
    during = GpuReading(index=2, uuid="GPU-2", sm_clock_hz=1.98e9)
    outcome = ProbeOutcome(
        "gemm", "bf16", 2, 701.5, "TFLOP/s", 1.2, NOW, params={"m": "8192"}, peak_ratio=0.71, during=during
    )
    msg = frames.probe_result(outcome)
    assert nanos_near(msg.time, NOW)
    assert dict(msg.params) == {"m": "8192"}
    assert msg.gpu == 2 and msg.HasField("gpu") and msg.peak_ratio == 0.71
    assert msg.during.index == 2 and msg.during.sm_clock_hz == 1.98e9
    assert not msg.during.HasField("power_watts")
    assert outcome.time == NOW  # the caller's outcome is not changed

    node_level = frames.probe_result(ProbeOutcome("nccl", "all_reduce", None, 360.0, "GB/s", 3.0, NOW))
    assert not node_level.HasField("gpu") and not node_level.HasField("peak_ratio")
    assert not node_level.HasField("during")


# -- whole frames ----------------------------------------------------------------------------


def simulated_snapshot() -> tuple[Agent, Snapshot]:
    config = load(None, {"node": "n7", "source": "sim", "sim": {"gpus": 4}})
    sim = SimNode("n7", gpus=4, faults=[], clock=lambda: NOW)
    agent = Agent(config, sim, SimHost(sim), ModelledProbes(sim), clock=lambda: NOW)
    result = asyncio.run(agent.handle_command(pb.Command(id="p", run_probes=pb.RunProbes())))
    assert result.ok
    return agent, agent.sample()


def test_a_full_snapshot_round_trips() -> None:
    agent, snapshot = simulated_snapshot()
    msg = frames.frame(snapshot, agent.boot_id, 42)
    again = pb.TelemetryFrame.FromString(msg.SerializeToString())
    assert again == msg
    assert (again.node, again.boot_id, again.seq) == ("n7", agent.boot_id, 42)
    assert nanos_near(again.time, NOW)
    assert len(again.gpus) == 4
    for wire, reading in zip(again.gpus, snapshot.gpus, strict=True):
        assert (wire.index, wire.uuid) == (reading.index, reading.uuid)
        assert wire.sm_clock_hz == reading.sm_clock_hz
        assert wire.temperature_celsius == reading.temperature_celsius
        assert wire.clock_event_reasons == reading.clock_event_reasons
        assert wire.row_remap_pending is reading.row_remap_pending
        assert [(n.link, n.active, n.crc_errors_total) for n in wire.nvlinks] == [
            (n.link, n.active, n.crc_errors_total) for n in reading.nvlinks
        ]
    assert snapshot.host is not None
    assert again.host.uptime_seconds == snapshot.host.uptime_seconds
    assert again.host.memory_total_bytes == snapshot.host.memory_total_bytes
    assert [p.device for p in again.host.infiniband] == [p.device for p in snapshot.host.infiniband]
    # Each CPU's reading stays with the agent's exporter; the frame counts the CPUs per governor.
    assert len(snapshot.host.cpus) == 32 and not again.host.cpus
    assert dict(again.host.cpu_governors) == {"performance": 32}
    assert again.host.cpu_governor == "performance" and again.host.cpu_frequency_hz > 0
    assert len(again.host.pcie_aer) == 4 and all(a.nvidia_gpu for a in again.host.pcie_aer)
    assert len(again.probes) == len(snapshot.probes) > 0
    for wire_probe, outcome in zip(again.probes, snapshot.probes, strict=True):
        assert (wire_probe.probe, wire_probe.variant, wire_probe.value) == (
            outcome.probe,
            outcome.variant,
            outcome.value,
        )
        assert wire_probe.HasField("gpu") == (outcome.gpu is not None)
        assert wire_probe.simulated and dict(wire_probe.params) == outcome.params
    assert [(c.name, c.success) for c in again.collectors] == [("gpu", True), ("host", True)]


def test_links_go_without_their_traffic_and_peer_and_the_reading_is_left_whole() -> None:
    links = [
        NvLinkReading(
            n, n != 3, 4, 10 + n, 20 + n, 30 + n, f"00000000:{n + 5:02x}:00.0", 10**15 + n, 10**14 + n
        )
        for n in range(18)
    ]
    reading = GpuReading(
        index=0,
        uuid="GPU-0",
        nvlinks=links,
        nvlink_tx_bytes_total=7 * 10**15,
        nvlink_rx_bytes_total=6 * 10**15,
    )
    kept = copy.deepcopy(reading)
    wire = pb.TelemetryFrame.FromString(
        frames.frame(Snapshot("n1", NOW, gpus=[reading]), "b", 1).SerializeToString()
    )
    (gpu,) = wire.gpus
    # Each link's number, state, version and error totals: all that the controller reads of it.
    assert [
        (n.link, n.active, n.version, n.crc_errors_total, n.replay_errors_total, n.recovery_errors_total)
        for n in gpu.nvlinks
    ] == [(n, n != 3, 4, 10 + n, 20 + n, 30 + n) for n in range(18)]
    # Its traffic and peer stay with the agent; the GPU's traffic goes as its totals.
    assert not any(n.HasField("tx_bytes_total") or n.HasField("rx_bytes_total") for n in gpu.nvlinks)
    assert not any(n.remote_pci_bus_id for n in gpu.nvlinks)
    assert (gpu.nvlink_tx_bytes_total, gpu.nvlink_rx_bytes_total) == (7 * 10**15, 6 * 10**15)
    assert gpu.nvlinks_inactive == 1 and gpu.nvlink_errors_digest == frames.nvlink_errors_digest(links)
    assert reading == kept  # the exporter and `--once --json` read it after the frame is built
    assert len(gpu.SerializeToString()) < 18 * 14 + 64


def test_hello_round_trips_with_inventory_and_host() -> None:
    agent, _ = simulated_snapshot()
    msg = agent.hello()
    again = pb.Hello.FromString(msg.SerializeToString())
    assert again == msg
    assert again.inventory.expected_gpu_count == 4
    assert [g.pci_bus_id for g in again.inventory.gpus] == [g.pci_bus_id for g in agent.inventory.gpus]
    assert again.inventory.gpus[0].nvlink_count == 18
    assert again.inventory.gpus[0].default_power_limit_watts == 700.0
    assert agent.host_facts is not None and again.host.hostname == agent.host_facts.hostname
    assert nanos_near(again.started_at, NOW)


def nanos_near(ts: Timestamp, unix_seconds: float) -> bool:
    """Within a microsecond: a float near 1.8e9 s holds no finer time than that."""
    return abs(ts.ToNanoseconds() - unix_seconds * 1e9) < 1_000


def test_timestamp_keeps_sub_second_precision() -> None:
    ts = frames.timestamp(NOW)
    assert ts.seconds == 1_800_000_000
    assert abs(ts.nanos - 250_000_000) < 1_000
    assert nanos_near(frames.timestamp(0.5), 0.5) and frames.timestamp(0.5).nanos == 500_000_000
