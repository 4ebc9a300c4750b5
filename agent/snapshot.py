"""One Snapshot per sampling cycle: plain data that the exporter reads and the stream sends."""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.probes.base import ProbeOutcome
from agent.sources.bmc import BmcSample
from agent.sources.gpu import GpuReading
from agent.sources.host import HostReading


@dataclass(slots=True)
class CollectorStatus:
    name: str
    success: bool
    duration_seconds: float
    error: str = ""


@dataclass(slots=True)
class Snapshot:
    node: str
    time: float
    gpus: list[GpuReading] = field(default_factory=list)
    host: HostReading | None = None
    probes: list[ProbeOutcome] = field(default_factory=list)
    collectors: dict[str, CollectorStatus] = field(default_factory=dict)
    bmc: BmcSample | None = None  # the latest completed BMC poll
    bmc_new: bool = False  # that poll completed since the previous snapshot: the frame carries it
