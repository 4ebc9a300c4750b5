"""The controller's view of the fleet: plain data, updated only by ingest on the event loop.

Latest readings stay as the wire's (sanitized) messages: detectors read them directly, and the
operator API returns them unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from operator import attrgetter
from sys import intern
from typing import Any

from controller.fleet.series import Series
from controller.fleet.trends import Trends
from protos.gpufleet.v1 import bmc_pb2
from protos.gpufleet.v1 import telemetry_pb2 as pb

ProbeKey = tuple[str, int | None, str, str]  # node, gpu (None: node-level), probe, variant


def lacks_power_limits(hello: pb.Hello) -> bool:
    """Whether a GPU of the Hello does not say its default power limit (an agent older than the field)."""
    return any(not info.HasField("default_power_limit_watts") for info in hello.inventory.gpus)


@dataclass(slots=True)
class GpuState:
    index: int
    sample: pb.GpuSample
    time: float
    held: dict[str, float] = field(default_factory=dict)  # condition -> since (unix seconds)

    def held_for(self, condition: str) -> float:
        """Seconds `condition` has held up to this reading (not to now: a node gone silent after one
        throttled sample has held it 0 s, and a held time stops growing when readings stop); 0 when
        it does not hold."""
        since = self.held.get(condition)
        return 0.0 if since is None else max(0.0, self.time - since)


def peak_ratio_of(result: pb.ProbeResult) -> float:
    """The result's peak_ratio, 0.0 when unset (as ProbeRecord keeps it)."""
    return result.peak_ratio if result.HasField("peak_ratio") else 0.0


@dataclass(slots=True)
class ProbeRecord:
    """One probe result. The result itself is kept serialized (`data`; `result` parses it again): a
    result taken from a frame as parsed would keep that whole frame's memory alive (protobuf's upb
    holds one arena per parsed message), ~95 KB a node for the frame of a probe round. peak_ratio,
    the one field detection reads of every result, is kept beside it once read (`ratio`; None: not
    read yet): a record loaded from the store is not parsed for it until detection asks, in its own
    process (712,500 results at 12,500 nodes, ~7% of a start)."""

    node: str
    gpu: int | None
    probe: str
    variant: str
    value: float
    unit: str
    time: float
    data: bytes
    ratio: float | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, node: str, gpu: int | None, result: pb.ProbeResult, time: float) -> ProbeRecord:
        """The record of `result` (its probe, variant, value and unit) taken at `time`. Its strings
        are interned, as a start's records are (store/stored_nodes.py): each read of a protobuf
        string field is a new str, and a fleet's records of frames held one of each a record
        (~9 KB a node of its 97 KB of Python objects)."""
        return cls(
            node,
            gpu,
            intern(result.probe),
            intern(result.variant),
            result.value,
            intern(result.unit),
            time,
            result.SerializeToString(),
            peak_ratio_of(result),
        )

    @property
    def result(self) -> pb.ProbeResult:
        """The result, parsed afresh at each call (a copy: changing it changes nothing here)."""
        return pb.ProbeResult.FromString(self.data)

    @property
    def peak_ratio(self) -> float:
        """The result's peak_ratio (0.0 when unset), parsed at the first call only."""
        ratio = self.ratio
        if ratio is None:
            ratio = self.ratio = peak_ratio_of(self.result)
        return ratio

    @property
    def key(self) -> ProbeKey:
        return (self.node, self.gpu, self.probe, self.variant)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its fields in order, read in one call: the default builds a dict of the slots
        for each record, and a detection process's copy of 12,500 nodes holds 712,500 of them."""
        return ProbeRecord, _record_fields(self)


_record_fields = attrgetter(*(f.name for f in fields(ProbeRecord)))


@dataclass(slots=True)
class NodeState:
    name: str
    hello: pb.Hello
    first_seen: float
    last_seen: float
    gpus: dict[int, GpuState] = field(default_factory=dict)
    host: pb.HostSample | None = None
    host_time: float = 0.0
    bmc: bmc_pb2.BmcSample | None = None  # the latest BMC poll; frames carry one only after a poll
    bmc_time: float = 0.0  # that poll's start (unix seconds), to refuse older samples
    connected: bool = False
    implausible_logged: set[str] = field(default_factory=set)  # fields whose impossible readings were logged
    # The controller's clock at the node's last Hello or accepted frame (last_seen is the frame's
    # own time, from the agent's clock); not stored: after a restart last_seen stands for it.
    last_heard: float = 0.0
    trends: Trends = field(default_factory=Trends)  # counter rates and recent XIDs (memory only)
    # gpu_model's answer and the Hello it read it from: a Hello is replaced, never changed, when the
    # agent says hello again. ListNodes asks for every node's (a fifth of its time at 12,500
    # nodes), detection's peer groups for every probe result's.
    model_of: tuple[pb.Hello, str] | None = field(default=None, repr=False, compare=False)
    # fleet/peers.py probe_classes' answer and the Hello it read it from, likewise: grouping every
    # probe result reads it for each node.
    classes_of: tuple[pb.Hello, Any] | None = field(default=None, repr=False, compare=False)
    # GPUs of the Hello without GpuInfo.default_power_limit_watts (an agent older than the field):
    # their readings fill it in (fleet/state.py fill_power_limits), so a rolling agent upgrade does
    # not split a class of GPUs in two.
    limits_unknown: bool = field(default=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.limits_unknown = lacks_power_limits(self.hello)

    @property
    def boot_id(self) -> str:
        return self.hello.boot_id

    @property
    def gpu_model(self) -> str:
        kept = self.model_of
        if kept is not None and kept[0] is self.hello:
            return kept[1]
        names = {g.name for g in self.hello.inventory.gpus}
        model = names.pop() if len(names) == 1 else ("mixed" if names else "")
        self.model_of = (self.hello, model)
        return model

    def gpu_name(self, index: int) -> str:
        for info in self.hello.inventory.gpus:
            if info.index == index:
                return info.name
        return ""

    def gpu_names(self) -> dict[int, str]:
        """The inventory's GPU names by index (the first of an index, as gpu_name reads it)."""
        return {g.index: g.name for g in reversed(self.hello.inventory.gpus)}


@dataclass(slots=True)
class Fleet:
    nodes: dict[str, NodeState] = field(default_factory=dict)
    probes: dict[ProbeKey, ProbeRecord] = field(default_factory=dict)
    acked: dict[tuple[str, str], int] = field(default_factory=dict)  # (node, boot) -> highest contiguous seq
    implausible: dict[str, int] = field(default_factory=dict)  # "Message.field" -> impossible readings
    # Each probe key's recent results, (time, value) oldest first, for own-history baselines: fed
    # by apply_frame, loaded from the store's probe_series at start (fleet/series.py).
    history: dict[ProbeKey, Series] = field(default_factory=dict)
    # Bumped whenever probe results, their history or the nodes' Hellos change (fleet/state.py,
    # fleet/expiry.py): what a detector derives from those alone is kept in `derived` and reused
    # while the version stands (probe_outlier's judgement of every result).
    probe_version: int = 0
    forgets: int = 0  # bumped by expiry.forget: keys went from probes, history and acked
    members: int = 0  # bumped whenever a node is added to or removed from `nodes` (fleet/node_order.py)
    derived: dict[str, tuple[object, ...]] = field(default_factory=dict)  # name -> (key..., value)


@dataclass(slots=True)
class FrameWrite:
    """Everything one accepted frame changes, written in one transaction with its ack position."""

    node: str
    boot_id: str
    seq: int
    time: float
    gpus: list[GpuState] = field(default_factory=list)
    host: pb.HostSample | None = None
    probes: list[ProbeRecord] = field(default_factory=list)
    bmc: bmc_pb2.BmcSample | None = None
    bmc_time: float = 0.0  # the BMC poll's start, which is not the frame's time
    implausible: dict[str, int] = field(default_factory=dict)  # "Message.field" -> readings cleared
    received: float = 0.0  # the controller's clock when the frame arrived
    state: bool = True  # write gpus and host to the store too (False: memory only, until the next due)
