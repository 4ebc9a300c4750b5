"""An ingest front plans its agents' frames, so that the controller's loop does not: it parses each
frame, makes the checks ingest makes before storing (controller/ingest_checks.py: the boot, the
seq, the times, GPU indices) and plans its changes (controller/fleet/state.py plan_changes,
screening NaN and impossible readings) from the node's state, which the controller sends with its
acceptance of the stream's Hello (ACCEPT) and the front then keeps up to date with its own plans.
The controller gets the plan and the frame as screened (a PLANNED record): it parses that frame,
stores, applies and acks it as any other, and passes the same bytes on to the detection process.
The plan also names the GPUs whose NVLink error counters read as in the GPU's previous reading on
the stream (the usual case), which no copy of the fleet then reads again (18 links a GPU).

Planning is only ever a shortcut: a frame the planner is not sure of goes to the controller as the
agent sent it (MSG), which checks and plans it itself, and from then on the stream's frames all go
that way, since the controller's state of the node may have moved past the planner's. So are:
- a frame that is not the next of the Hello's boot (a duplicate, a gap, a spool floor moving, a
  replay of another boot's spool) or that names another node;
- a frame that any check refuses (the controller refuses it with the same words);
- every frame of a stream whose agent sent anything between its Hello and the controller's
  acceptance (agents wait for it: agent/stream/client.py), or whose Hello the controller did not
  know the node of by then.
Messages other than frames (command results) pass as they are, and planning goes on.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Callable
from typing import NamedTuple

from google.protobuf.message import DecodeError

from controller import ingest_checks as checks
from controller.errors import InvalidMessage, RefusedFrame
from controller.fleet.model import GpuState, NodeState
from controller.fleet.state import FramePlan, plan_changes
from controller.fleet.trends import links_seen
from controller.frame_bytes import frame_bytes
from protos.gpufleet.v1 import telemetry_pb2 as pb

log = logging.getLogger("gpufleet.controller.front")
_NO_SAMPLE = pb.GpuSample()  # planning reads a GPU's time and held conditions, not its sample


class PlanState(NamedTuple):
    """What planning a node's next frame reads, as the controller holds it (ACCEPT's payload)."""

    node: str
    boot_id: str  # the Hello's
    acked: int  # the boot's position: the next frame planned is acked + 1
    gpus: dict[int, tuple[float, dict[str, float]]]  # index -> (time, held conditions)
    host_time: float
    bmc_time: float
    max_clock_skew_seconds: float  # limits.max_clock_skew_seconds: how far ahead a time may be


def state_of(node: NodeState, boot_id: str, acked: int, max_clock_skew_seconds: float) -> PlanState:
    gpus = {index: (gpu.time, dict(gpu.held)) for index, gpu in node.gpus.items()}
    return PlanState(node.name, boot_id, acked, gpus, node.host_time, node.bmc_time, max_clock_skew_seconds)


def planned_payload(plan: FramePlan, frame: bytes) -> bytes:
    return pickle.dumps((plan, frame), protocol=pickle.HIGHEST_PROTOCOL)


def planned_parts(payload: bytes) -> tuple[FramePlan, bytes]:
    plan, frame = pickle.loads(payload)
    assert isinstance(plan, FramePlan) and isinstance(frame, bytes)
    return plan, frame


class StreamPlanner:
    """Plans one stream's frames, starting from the controller's state of its node."""

    def __init__(self, state: PlanState, clock: Callable[[], float] = time.time) -> None:
        self.node = NodeState(state.node, pb.Hello(), 0.0, 0.0)  # only what planning reads is kept
        self.node.gpus = {i: GpuState(i, _NO_SAMPLE, t, held) for i, (t, held) in state.gpus.items()}
        self.node.host_time, self.node.bmc_time = state.host_time, state.bmc_time
        self.boot_id, self.acked = state.boot_id, state.acked
        self.max_clock_skew_seconds = state.max_clock_skew_seconds
        self.clock = clock
        self.active = True
        self.planned = 0
        self.links: dict[int, object] = {}  # GPU -> its last NVLink reading taken (digest, or link_read)

    def plan(self, message: bytes) -> bytes | None:
        """The PLANNED payload for this AgentMessage, or None: relay it as the agent sent it."""
        if not self.active:
            return None
        try:
            return self._plan(message)
        except Exception:  # a planner's fault must not cost the frame: the controller plans it
            log.exception("planning a frame of node %s failed; relaying it as sent", self.node.name)
            self.active = False
            return None

    def _plan(self, message: bytes) -> bytes | None:
        try:
            parsed = pb.AgentMessage.FromString(message)
        except DecodeError:
            self.active = False  # the controller refuses it, and the stream with it
            return None
        if parsed.WhichOneof("msg") != "frame":
            return None
        frame, now = parsed.frame, self.clock()
        if not self._plannable(frame, now):
            self.active = False
            return None
        plan = plan_changes(self.node, frame, now)  # screens the frame
        plan = plan._replace(links_unchanged=self._links_unchanged(frame, plan))
        self._applied(frame, plan)
        self.planned += 1
        body = None if plan.non_finite or plan.implausible else frame_bytes(message)
        return planned_payload(plan, body if body is not None else frame.SerializeToString())

    def _plannable(self, frame: pb.TelemetryFrame, now: float) -> bool:
        """Whether the controller, holding what this planner holds, would take the frame as the next."""
        if frame.node != self.node.name or frame.boot_id != self.boot_id:
            return False
        if frame.seq != self.acked + 1 or frame.spool_floor_seq > frame.seq:
            return False
        try:
            checks.frame_id(frame)
        except (InvalidMessage, RefusedFrame):
            return False
        if len({g.index for g in frame.gpus}) != len(frame.gpus):
            return False
        return checks.first_bad_time(frame, now, self.max_clock_skew_seconds) is None

    def _links_unchanged(self, frame: pb.TelemetryFrame, plan: FramePlan) -> tuple[int, ...]:
        """The GPUs taken whose NVLink error counters read as in their reading this planner took
        before (found here, on the front's core, rather than by every copy of the fleet): by the
        links' digest when the agent sends one, else by reading the links."""
        same = []
        samples = frame.gpus
        for position, _ in plan.gpus:
            sample = samples[position]
            if not sample.nvlinks:
                self.links.pop(sample.index, None)
                continue
            read = links_seen(sample)
            if self.links.get(sample.index) == read:
                same.append(sample.index)
            self.links[sample.index] = read
        return tuple(same)

    def _applied(self, frame: pb.TelemetryFrame, plan: FramePlan) -> None:
        """The node's state as the controller's apply_frame leaves it, as far as planning reads it."""
        samples = frame.gpus
        for position, held in plan.gpus:
            index = samples[position].index
            self.node.gpus[index] = GpuState(index, _NO_SAMPLE, plan.time, held)
        if plan.host:
            self.node.host_time = plan.time
        if plan.bmc_time is not None:
            self.node.bmc_time = plan.bmc_time
        self.acked = frame.seq
