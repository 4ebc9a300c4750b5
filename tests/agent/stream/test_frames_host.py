"""HostReading -> HostSample -> HostReading: every field, every list, through the wire's bytes."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from google.protobuf.message import Message

from agent.snapshot import Snapshot
from agent.sources.host import (
    CpuCoreReading,
    DiskReading,
    HostReading,
    InfinibandPortReading,
    NetInterfaceReading,
    PcieAerReading,
)
from agent.sources.sim import SimHost, SimNode
from agent.stream import frames
from protos.gpufleet.v1 import telemetry_pb2 as pb


def unfill(msg: Message, cls: type) -> Any:
    """The dataclass `cls` back from `msg` by field name: unset optional fields become None."""
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if typing.get_origin(hint) is list:
            (item,) = typing.get_args(hint)
            kwargs[f.name] = [unfill(m, item) for m in getattr(msg, f.name)]
        elif msg.DESCRIPTOR.fields_by_name[f.name].has_presence and not msg.HasField(f.name):
            kwargs[f.name] = None
        else:
            kwargs[f.name] = getattr(msg, f.name)
    return cls(**kwargs)


def through_the_wire(reading: HostReading) -> HostReading:
    msg = frames.fill(pb.HostSample(), reading)
    again = pb.HostSample.FromString(msg.SerializeToString())
    result: HostReading = unfill(again, HostReading)
    return result


FULL = HostReading(
    cpu_utilization_ratio=0.4125,
    load1=14.2,
    memory_used_bytes=412 * 1024**3,
    memory_total_bytes=2_113_524_916 * 1024,
    cpu_governor="performance",
    cpu_frequency_hz=2.98e9,
    uptime_seconds=514290.22,
    load5=13.9,
    load15=13.1,
    memory_available_bytes=2_113_524_916 * 1024 - 412 * 1024**3,
    swap_used_bytes=0,  # zero is a reading, not an absence
    swap_total_bytes=8 * 1024**3,
    hugepages_total=1024,
    hugepages_free=512,
    hugepage_size_bytes=2 * 1024**2,
    transparent_hugepage="madvise",
    numa_balancing=False,
    kernel="5.15.0-1042-nvidia",
    cpus=[
        CpuCoreReading(0, 0.61, 3.0e9, "performance"),
        CpuCoreReading(1, None, None, ""),  # a core without cpufreq, not yet measured
        CpuCoreReading(223, 0.0, 1.2e9, "powersave"),
    ],
    network=[
        NetInterfaceReading("eno1", 10, 20, 30, 40, 0, 1, 2, 3),
        NetInterfaceReading("enp41s0f0np0", rx_bytes_total=2**62),  # the rest unread
    ],
    disks=[
        DiskReading("nvme0n1", 512 * 10**9, 512 * 10**8, 123456, 65432, 5080.785),
        DiskReading("nvme1n1"),
    ],
    infiniband=[
        InfinibandPortReading(
            "mlx5_0", 1, "infiniband", "active", "link_up", 400.0, 1, 2, 0, 0, 14, 4 * 2**50, 4 * 2**49
        ),
        InfinibandPortReading("mlx5_1", 1, "infiniband", "down", "polling", 10.0, 3, 17, 5, 2, 0, None, None),
        InfinibandPortReading("mlx5_8", 2, "ethernet", "active", "link_up", 200.0),
    ],
    pcie_aer=[
        PcieAerReading("0000:18:00.0", 3, 0, 0, nvidia_gpu=True),
        PcieAerReading("0000:17:00.0", 12, 1, None, nvidia_gpu=False),
    ],
)


def test_every_field_and_list_round_trips() -> None:
    again = through_the_wire(FULL)
    assert again == FULL
    # Each list and each nested field really was filled (no default slipped through).
    for f in dataclasses.fields(HostReading):
        assert getattr(FULL, f.name) not in (None, []), f.name


def test_an_empty_reading_stays_empty() -> None:
    assert through_the_wire(HostReading()) == HostReading()


def test_a_simulated_hosts_reading_round_trips() -> None:
    clock = iter(range(1_800_000_000, 1_800_000_100, 10))
    node = SimNode("n1", gpus=2, clock=lambda: float(next(clock)))
    reading = SimHost(node).read()
    assert reading.cpus and reading.infiniband and reading.pcie_aer and reading.network and reading.disks
    assert through_the_wire(reading) == reading


def test_a_frame_counts_the_cpus_per_governor_and_carries_the_rest_of_the_host() -> None:
    snapshot = Snapshot(node="n1", time=1_800_000_000.0, host=FULL)
    frame = pb.TelemetryFrame.FromString(frames.frame(snapshot, "boot", 1).SerializeToString())
    assert not frame.host.cpus  # each CPU's reading is the agent's exporter's alone
    assert dict(frame.host.cpu_governors) == {"performance": 1, "powersave": 1}  # cpu1 has none
    assert unfill(frame.host, HostReading) == dataclasses.replace(FULL, cpus=[])
    assert FULL.cpus  # (the reading itself is left whole)
