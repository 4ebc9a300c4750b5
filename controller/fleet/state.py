"""Pure updates of fleet state: what a frame changes (plan) and applying that change (apply).

Ingest persists the plan first and applies it to memory only after the commit, so memory never
shows what the store does not hold.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Collection
from typing import NamedTuple

from google.protobuf.message import Message

from controller.fleet import probe_groups, probe_index, probe_schedule
from controller.fleet.conditions import update_held
from controller.fleet.derived import probes_version
from controller.fleet.model import (
    Fleet,
    FrameWrite,
    GpuState,
    NodeState,
    ProbeKey,
    ProbeRecord,
    lacks_power_limits,
)
from controller.fleet.plausible import PROBE_VALUE, probe_value_plausible, screen
from controller.fleet.probe_info import same_probe_facts
from controller.fleet.repeated import each
from controller.fleet.series import Series
from protos.gpufleet.v1 import bmc_pb2
from protos.gpufleet.v1 import telemetry_pb2 as pb

log = logging.getLogger("gpufleet.controller.ingest")


class FramePlan(NamedTuple):
    """What planning decided about one frame, beside the frame itself as screened: with that frame
    (its bytes, parsed again elsewhere) write_of builds the same FrameWrite, so another process can
    plan (an ingest front) or apply (the detection process) from the bytes alone, not a pickled write."""

    time: float  # the frame's time, clamped to now
    received: float  # the planner's clock when the frame arrived
    gpus: tuple[tuple[int, dict[str, float]], ...]  # (position in frame.gpus, held) of readings taken
    host: bool  # frame.host is taken (newer than what is held)
    bmc_time: float | None  # frame.bmc is taken, polled then; None: not
    probes: tuple[tuple[int, float], ...]  # (position in frame.probes, its time) of results kept
    implausible: dict[str, int]  # "Message.field" -> readings cleared
    non_finite: dict[str, int]  # "Message.field" -> NaN/Inf readings cleared (ProbeResult.value: dropped)
    # GPU indices whose NVLink error counters read as in the GPU's previous reading this planner
    # took (an ingest front's, which sees a stream's frames in order; apply_frame skips reading them)
    links_unchanged: tuple[int, ...] = ()


def plan_frame(node: NodeState, frame: pb.TelemetryFrame, now: float) -> tuple[FrameWrite, int]:
    """The state changes of one accepted frame (plan and write_of), and how many non-finite readings
    it carried."""
    plan = plan_changes(node, frame, now)
    return write_of(node.name, frame, plan), sum(plan.non_finite.values())


def plan_changes(node: NodeState, frame: pb.TelemetryFrame, now: float) -> FramePlan:
    """What one accepted frame changes; screens the frame in place.

    Latest-state rows change only when the frame is newer than what is held (a replay of an older
    boot's spool must not overwrite fresher readings); the BMC sample likewise, by its poll time;
    probe results always count, by their time. Physically impossible readings (fleet/plausible.py)
    are stored as missing, and a probe result with an impossible value is dropped; the plan's
    `implausible` counts them per field.
    """
    at = min(frame.time.ToNanoseconds() / 1e9 if frame.HasField("time") else now, now)
    probes: list[tuple[int, float]] = []
    non_finite: Counter[str] = Counter()
    implausible: Counter[str] = Counter()
    kept: list[Message] = []  # the results kept, screened with the readings below
    for position, result in enumerate(each(frame.probes)):
        if result.error or not math.isfinite(result.value) or result.value <= 0:
            if not result.error:
                non_finite[PROBE_VALUE] += 1
            continue
        when = min(result.time.ToNanoseconds() / 1e9 if result.HasField("time") else at, now)
        if not probe_value_plausible(result):  # before screen(): it reads peak_ratio as sent
            implausible[PROBE_VALUE] += 1
            continue
        kept.append(result)  # its value is finite (checked above): screening reads the rest of it
        probes.append((position, when))
    samples = each(frame.gpus)
    readings: list[Message] = [*kept, *samples]
    readings += [getattr(frame, part) for part in ("host", "bmc") if frame.HasField(part)]
    for reading in readings:  # NaN/Inf and impossible values stored as missing, in one walk each
        cleared, labels = screen(reading)
        if cleared:  # (nearly never: no Counter.update a reading)
            non_finite.update(cleared)
        if labels:
            implausible.update(labels)
    gpus: list[tuple[int, dict[str, float]]] = []
    for position, sample in enumerate(samples):
        previous = node.gpus.get(sample.index)
        if previous is not None and previous.time > at:
            continue
        gpus.append((position, update_held(previous.held if previous else {}, sample, at)))
    bmc_time = None
    if frame.HasField("bmc"):
        # Ordered by the poll's start, not the frame's time; clamped to now like the frame's, so one
        # sample from a clock running ahead cannot hold off every later poll.
        polled = min(frame.bmc.time.ToNanoseconds() / 1e9 if frame.bmc.HasField("time") else at, now)
        if node.bmc_time <= polled:
            bmc_time = polled
    host = frame.HasField("host") and node.host_time <= at
    return FramePlan(at, now, tuple(gpus), host, bmc_time, tuple(probes), dict(implausible), dict(non_finite))


def write_of(node: str, frame: pb.TelemetryFrame, plan: FramePlan) -> FrameWrite:
    """The FrameWrite of `frame` (screened as planned) under `plan`."""
    samples, results = frame.gpus, frame.probes
    write = FrameWrite(node, frame.boot_id, frame.seq, plan.time, received=plan.received)
    write.implausible = dict(plan.implausible)
    for position, when in plan.probes:
        result = results[position]
        write.probes.append(
            ProbeRecord.of(node, result.gpu if result.HasField("gpu") else None, result, when)
        )
    for position, held in plan.gpus:
        sample = samples[position]
        write.gpus.append(GpuState(sample.index, sample, plan.time, held))
    if plan.host:
        write.host = frame.host
    if plan.bmc_time is not None:
        write.bmc, write.bmc_time = frame.bmc, plan.bmc_time
    return write


def apply_frame(
    fleet: Fleet, write: FrameWrite, *, counters: bool = True, links_unchanged: Collection[int] = ()
) -> None:
    """Apply an accepted frame's changes. counters=False leaves the error counters' trends alone (the
    detectors, their only readers, then run in the detection process, which keeps them); XID events
    are kept either way. links_unchanged: FramePlan.links_unchanged."""
    node = fleet.nodes[write.node]
    node.last_seen = max(node.last_seen, write.time)
    node.last_heard = max(node.last_heard, write.received)
    _count_implausible(fleet, node, write.implausible)
    if node.limits_unknown and write.gpus:
        fill_power_limits(fleet, node, write.gpus)
    for gpu in write.gpus:
        node.gpus[gpu.index] = gpu
        node.trends.observe_gpu(
            gpu.sample, gpu.time, counters=counters, links_unchanged=gpu.index in links_unchanged
        )
    if write.host is not None:
        node.host, node.host_time = write.host, write.time
        if counters:
            node.trends.observe_host(write.host, write.time)
    if write.bmc is not None:
        # A copy: the frame's own sample would keep the whole frame's memory alive until the next
        # poll (upb holds one arena per parsed message), ~55 KB a node.
        node.bmc, node.bmc_time = bmc_pb2.BmcSample(), write.bmc_time
        node.bmc.CopyFrom(write.bmc)
    if write.probes:
        before = probes_version(fleet)
        fleet.probe_version += 1
        for record in write.probes:
            # One key tuple for both maps: a new one at each `.key`, kept by each map it enters.
            key = record.key
            current = fleet.probes.get(key)
            if current is None or current.time <= record.time:
                fleet.probes[key] = record
            remember(fleet, key, record.time, record.value)
        probe_schedule.probed(fleet, before, write.probes)
        probe_index.probed(fleet, before, write.probes)
        probe_groups.probed(fleet, before, write.probes)
    fleet.acked[(write.node, write.boot_id)] = write.seq


def fill_power_limits(fleet: Fleet, node: NodeState, gpus: list[GpuState]) -> None:
    """An agent older than GpuInfo.default_power_limit_watts says each GPU's default limit in its
    readings only: the node's Hello takes it from them (a copy: a Hello is replaced, never changed),
    so its GPUs join the class of the GPUs alike whose agents already say it (fleet/peers.py) rather
    than one of their own while the agents are upgraded; the results' groups are worked out again."""
    readings = {g.index: g.sample for g in gpus if g.sample.HasField("default_power_limit_watts")}
    if not readings:
        return
    hello = pb.Hello()
    hello.CopyFrom(node.hello)
    filled = False
    for info in hello.inventory.gpus:
        sample = readings.get(info.index)
        if sample is not None and not info.HasField("default_power_limit_watts"):
            info.default_power_limit_watts = sample.default_power_limit_watts
            filled = True
    if filled:
        node.hello = hello
        node.limits_unknown = lacks_power_limits(hello)
        fleet.probe_version += 1


def remember(fleet: Fleet, key: ProbeKey, time: float, value: float) -> None:
    """Add a result to its key's history (kept in time order, bounded to HISTORY_POINTS)."""
    series = fleet.history.get(key)
    if series is None:
        series = fleet.history[key] = Series()
    series.add(time, value)


def _count_implausible(fleet: Fleet, node: NodeState, counts: dict[str, int]) -> None:
    for name, count in counts.items():
        fleet.implausible[name] = fleet.implausible.get(name, 0) + count
        if name not in node.implausible_logged:  # once per node and field; the metric counts every one
            node.implausible_logged.add(name)
            log.warning("node %s: impossible %s readings are stored as missing", node.name, name)


def apply_hello(fleet: Fleet, hello: pb.Hello, acked: int, now: float) -> NodeState:
    """What the probe results' readers worked out (Fleet.probe_version) stands when the node's last
    Hello said the same of its GPUs and probes: a fleet reconnecting at once, or an agent restarted
    now and then somewhere in a large one, no longer has the next pass group and judge every stored
    result afresh."""
    node = fleet.nodes.get(hello.node)
    if node is None:
        fleet.probe_version += 1
        node = NodeState(hello.node, hello, now, now)
        fleet.nodes[hello.node] = node
        fleet.members += 1
    else:
        if not same_probe_facts(node.hello, hello):
            fleet.probe_version += 1
        node.hello, node.last_seen = hello, now
    node.last_heard = max(node.last_heard, now)
    node.limits_unknown = lacks_power_limits(hello)
    present = {g.index for g in hello.inventory.gpus}
    for index in list(node.gpus):
        if index not in present:  # a GPU gone from the inventory has no current state
            del node.gpus[index]
    key = (hello.node, hello.boot_id)
    fleet.acked[key] = max(fleet.acked.get(key, 0), acked)
    return node
