"""Snapshot and inventory -> wire messages.

Dataclass field names equal proto field names (see agent/sources/gpu.py), so conversion is one
generic copy: None stays unset, lists of dataclasses become repeated messages.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from collections import Counter
from collections.abc import Sequence
from typing import Any

from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from agent.probes.base import ProbeOutcome
from agent.probes.kernel import ProbeInfo
from agent.probes.kernels import infos
from agent.snapshot import Snapshot
from agent.sources.bmc import BmcSample
from agent.sources.gpu import Inventory, NvLinkReading
from agent.sources.host import HostFacts, InfinibandPortReading
from protos.gpufleet.v1 import bmc_pb2
from protos.gpufleet.v1 import telemetry_pb2 as pb

_LINK_TOTALS = struct.Struct("<IQQQ")  # link, crc, replay, recovery
_PORT_NUMBERS = struct.Struct("<IdQQQQ")  # port, rate (-1: unread), link downed, symbol, receive, recovery

# What of each NVLink's reading stays with the agent (its own reading, as `gpufleet agent --once
# --json` shows it): the controller reads a link's number, state, version and error totals only. The
# traffic goes in the frame as the GPU's totals (GpuSample.nvlink_tx/rx_bytes_total, as the node's
# /metrics exports it too); each link's traffic and peer bus id were 36 of its 48 bytes on the wire,
# 5.2 KB of an 8-GPU frame of 12.8.
_LINK_LOCAL: dict[str, Any] = {"remote_pci_bus_id": "", "tx_bytes_total": None, "rx_bytes_total": None}


def timestamp(unix_seconds: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(unix_seconds * 1e9))
    return ts


def fill(msg: Message, obj: Any) -> Message:
    """Copy every non-None field of dataclass `obj` into the same-named field of `msg`."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value is None:
            continue
        if isinstance(value, list):
            target = getattr(msg, f.name)
            for item in value:
                if dataclasses.is_dataclass(item):
                    fill(target.add(), item)
                else:
                    target.append(item)
        elif isinstance(value, dict):
            getattr(msg, f.name).update(value)
        elif dataclasses.is_dataclass(value):
            fill(getattr(msg, f.name), value)
        else:
            setattr(msg, f.name, value)
    return msg


def probe_info(info: ProbeInfo) -> pb.ProbeInfo:
    return pb.ProbeInfo(
        name=info.name,
        unit=info.unit,
        higher_is_better=info.higher_is_better,
        node_level=info.node_level,
        variants=info.variants,
        description=info.description,
    )


def probe_result(outcome: ProbeOutcome) -> pb.ProbeResult:
    msg = pb.ProbeResult()
    fill(msg, dataclasses.replace(outcome, time=None))  # type: ignore[arg-type]
    msg.time.CopyFrom(timestamp(outcome.time))
    return msg


def bmc_sample(sample: BmcSample) -> bmc_pb2.BmcSample:
    msg = bmc_pb2.BmcSample()
    fill(msg, dataclasses.replace(sample, time=None))  # type: ignore[arg-type]
    msg.time.CopyFrom(timestamp(sample.time))
    return msg


def frame(snapshot: Snapshot, boot_id: str, seq: int) -> pb.TelemetryFrame:
    msg = pb.TelemetryFrame(node=snapshot.node, boot_id=boot_id, seq=seq, time=timestamp(snapshot.time))
    for reading in snapshot.gpus:
        sample = fill(msg.gpus.add(), dataclasses.replace(reading, nvlinks=[]))
        if reading.nvlinks:
            links = sample.nvlinks  # type: ignore[attr-defined]
            for link in reading.nvlinks:
                fill(links.add(), dataclasses.replace(link, **_LINK_LOCAL))
            sample.nvlink_errors_digest = nvlink_errors_digest(reading.nvlinks)  # type: ignore[attr-defined]
            sample.nvlinks_inactive = sum(not link.active for link in reading.nvlinks)  # type: ignore[attr-defined]
    if snapshot.host is not None:
        host = snapshot.host
        # Each CPU's reading stays with the agent's exporter (the controller reads none of them):
        # the frame says how many CPUs run each governor (HostSample.cpu_governors).
        fill(msg.host, dataclasses.replace(host, cpus=[]))
        msg.host.cpu_governors.update(Counter(cpu.governor for cpu in host.cpus if cpu.governor))
        if host.infiniband:
            msg.host.infiniband_digest = infiniband_digest(host.infiniband)
    msg.probes.extend(probe_result(o) for o in snapshot.probes)
    for status in snapshot.collectors.values():
        fill(msg.collectors.add(), status)
    if snapshot.bmc is not None and snapshot.bmc_new:
        msg.bmc.CopyFrom(bmc_sample(snapshot.bmc))
    return msg


def infiniband_digest(ports: Sequence[InfinibandPortReading]) -> int:
    """HostSample.infiniband_digest: 8 bytes of BLAKE2b over each port's names, state, rate and
    error totals (unread totals as 0, as the controller reads an unset one), in order; never 0."""
    digest = hashlib.blake2b(digest_size=8)
    for p in ports:
        digest.update(f"{p.device}\0{p.link_layer}\0{p.state}\0{p.physical_state}\0".encode())
        totals = (
            p.link_downed_total,
            p.symbol_error_total,
            p.port_rcv_errors_total,
            p.link_error_recovery_total,
        )
        rate = -1.0 if p.rate_gbps is None else p.rate_gbps
        digest.update(_PORT_NUMBERS.pack(p.port, rate, *(total or 0 for total in totals)))
    return int.from_bytes(digest.digest(), "little") or 1


def nvlink_errors_digest(links: Sequence[NvLinkReading]) -> int:
    """GpuSample.nvlink_errors_digest: 8 bytes of BLAKE2b over each link's number and error totals
    (unread ones as 0, as the controller reads an unset total), in order; never 0 (not sent)."""
    digest = hashlib.blake2b(digest_size=8)
    for link in links:
        totals = (link.crc_errors_total, link.replay_errors_total, link.recovery_errors_total)
        digest.update(_LINK_TOTALS.pack(link.link, *(total or 0 for total in totals)))
    return int.from_bytes(digest.digest(), "little") or 1


def hello(
    node: str,
    boot_id: str,
    agent_version: str,
    inventory: Inventory,
    *,
    host: HostFacts | None,
    probes: list[str],
    started_at: float,
    capabilities: list[str] | None = None,
    probe_infos: Sequence[ProbeInfo] | None = None,
) -> pb.Hello:
    """The stream's first message. Each offered probe goes out twice: its name in `probes` (for
    controllers older than ProbeInfo) and its declared facts in `probe_infos` (default: the
    registry's facts for each name in `probes`)."""
    msg = pb.Hello(
        node=node,
        boot_id=boot_id,
        agent_version=agent_version,
        probes=probes,
        capabilities=(["run_probes"] if probes else []) if capabilities is None else capabilities,
        started_at=timestamp(started_at),
    )
    msg.probe_infos.extend(probe_info(i) for i in (infos(probes) if probe_infos is None else probe_infos))
    fill(msg.inventory, inventory)
    if host is not None:
        fill(msg.host, host)
    return msg
