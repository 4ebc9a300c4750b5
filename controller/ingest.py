"""Ingest: validate, dedupe by (node, boot, seq), persist, then update memory; ack only what is stored."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Protocol

from controller import ingest_checks as checks
from controller.errors import InvalidMessage, RefusedFrame, SequenceGap
from controller.fleet.adopt import adopt
from controller.fleet.model import Fleet, GpuState, NodeState, ProbeKey
from controller.fleet.repeated import each
from controller.fleet.series import Series
from controller.fleet.state import FramePlan, apply_frame, apply_hello, plan_changes, write_of
from controller.metrics_record import LAG_BUCKETS, SecondsHistogram
from controller.node_limit import NodeLimit
from controller.recording import RecordHub
from controller.store.store import Store
from controller.store.stored_nodes import StoredNodes
from protos.gpufleet.v1 import telemetry_pb2 as pb
from protos.names import MAX_NODE_NAME

log = logging.getLogger("gpufleet.controller.ingest")
MAX_NAME = MAX_NODE_NAME  # a DNS name, as Kubernetes node names are


class FleetMirror(Protocol):
    def hello(self, hello: pb.Hello, acked: int, now: float) -> None: ...

    def frame(self, node: str, plan: FramePlan, frame: bytes) -> None: ...

    def adopt(self, stored: StoredNodes, heard: Mapping[str, float]) -> None: ...

    def history(self, history: Mapping[ProbeKey, Series]) -> None: ...


@dataclass(frozen=True, slots=True)
class PlannedFrame:
    """A frame an ingest front checked and planned (controller/fronts/planner.py): `raw` is its bytes
    as screened, `frame` those parsed."""

    frame: pb.TelemetryFrame
    plan: FramePlan
    raw: bytes


@dataclass(slots=True)
class IngestCounters:
    frames: int = 0
    duplicates: int = 0
    non_finite: int = 0
    refused: int = 0  # frames refused for good (RefusedFrame): the agent sets them aside
    taken_over: int = 0  # nodes taken over from another replica (replica_ingest)


class Ingest:
    def __init__(
        self,
        fleet: Fleet,
        store: Store,
        clock: Callable[[], float] = time.time,
        max_nodes: int | None = None,
        *,
        max_clock_skew_seconds: float = 300.0,  # limits.max_clock_skew_seconds
        hub: RecordHub | None = None,
        state_every_seconds: float = 300.0,  # db_state_seconds
    ) -> None:
        self.fleet = fleet
        self.max_clock_skew_seconds = max_clock_skew_seconds
        self.store = store
        self.clock = clock
        self.counters = IngestCounters()
        self.lag = SecondsHistogram(LAG_BUCKETS)  # ingest time minus the frame's time, accepted frames
        self.last_frame: dict[str, float] = {}  # node -> newest accepted frame's time (clamped to now)
        self._locks: dict[str, asyncio.Lock] = {}
        self.node_limit = NodeLimit(max_nodes, clock)  # limits.max_nodes
        self.hub = hub or RecordHub()  # accepted Hellos and stored frames go to its readers (Record)
        # A node's latest readings are written at most every state_every_seconds (0: with every
        # frame), queued beside the frames, not waited for: the next frame replaces them anyway, so a
        # crash loses at most that much of the newest readings (never an ack position, a probe result
        # or a finding). state_saved: node -> when they were last queued; unsaved: memory is newer.
        self.state_every_seconds = state_every_seconds
        self.state_saved: dict[str, float] = {}
        self.unsaved: set[str] = set()
        self.state_failures = 0
        # replica_ingest: each node's XID events since its readings were last written, written with
        # them (the readings hold only the latest frame's), so the leader sees every one.
        self.unsaved_xids: dict[str, list[pb.GpuSample]] = {}
        self._due: set[str] = set()  # readings due, to be written at the end of this turn of the loop
        self._gathering: asyncio.Handle | None = None
        # A copy of the fleet elsewhere (the detection process) gets each change applied here. The
        # error counters' trends (NodeState.trends: rates over a window) are then kept in the copy
        # only, where the detectors read them; a copy started again from this fleet (the process
        # died) starts their rates afresh, as a controller restart does. XID events stay kept here.
        self.mirror: FleetMirror | None = None
        self.hellos_under_way = 0  # Hellos being taken in now (the detection copy waits for them)

    def _lock(self, node: str) -> asyncio.Lock:
        return self._locks.setdefault(node, asyncio.Lock())

    async def hello(self, hello: pb.Hello) -> int:
        """Register the agent; return the highest seq already stored for its boot (0 if none)."""
        if not hello.node or len(hello.node) > MAX_NAME:
            raise InvalidMessage(f"hello: node name must be 1..{MAX_NAME} characters")
        if not hello.boot_id:
            raise InvalidMessage("hello: boot_id is required")
        if len(hello.boot_id) > checks.MAX_BOOT_ID:
            raise InvalidMessage(f"hello: boot_id is longer than {checks.MAX_BOOT_ID} characters")
        checks.hello_times(hello, self.clock(), self.max_clock_skew_seconds)
        self.hellos_under_way += 1
        try:
            # The limit first: a refused name leaves nothing behind (not even its lock).
            async with self.node_limit.joining(self.fleet.nodes, hello.node), self._lock(hello.node):
                now = self.clock()
                if self.store.owner is None:
                    acked = await self.store.save_hello(hello, now)
                else:
                    acked = await self._take(hello, now)
                apply_hello(self.fleet, hello, acked, now)
                if self.mirror is not None:
                    self.mirror.hello(hello, acked, now)
                self.hub.hello(hello, now)
                return self.fleet.acked[(hello.node, hello.boot_id)]
        finally:
            self.hellos_under_way -= 1

    async def _take(self, hello: pb.Hello, now: float) -> int:
        """replica_ingest: this replica ingests the Hello's node from now (controller/store/owners.py)
        and stores the Hello; the ack position of its boot. When another replica did until now, or
        this one never did, the node is first taken in as that one stored it: its ack positions,
        readings and probe results (controller/fleet/adopt.py)."""
        node = hello.node
        taken = await self.store.take_node(hello, now, known=node in self.fleet.nodes)
        if taken.rows is None:
            return taken.acked
        stored = taken.rows.fleet()
        if taken.before is not None:
            log.info("node %s: taken over from replica %s (its agent connected here)", node, taken.before)
            self.counters.taken_over += 1
        row = stored.nodes.get(node)
        heard = {node: row.last_seen} if row is not None else {}
        adopt(self.fleet, stored, heard, counters=self.mirror is None)
        if self.mirror is not None:
            self.mirror.adopt(taken.rows, heard)
        if row is not None:
            newest = max([g.time for g in row.gpus.values()] + [row.host_time])
            if newest > 0:
                self.last_frame[node] = max(self.last_frame.get(node, 0.0), newest)
        return taken.acked

    def _state_changed(self, node: str, now: float) -> None:
        """A frame changed the node's readings: written when due (state_every_seconds), gathered
        with the others due in this turn of the loop into one store job (_write_due). The frames of
        one group commit resume in the same turn, so the busier the store, the more nodes a job
        holds: a standby (due every replica_sync_seconds) wrote one job per frame, each with its own
        savepoint, GPU rows and host row statements, about two thirds of its store thread's work."""
        self.unsaved.add(node)
        if now - self.state_saved.get(node, float("-inf")) >= self.state_every_seconds:
            self._due.add(node)
            if self._gathering is None:
                self._gathering = asyncio.get_running_loop().call_soon(self._write_due)

    def _write_due(self) -> None:
        self._gathering = None
        names, self._due = sorted(self._due), set()
        if names:
            self.save_state(names, self.clock())

    def save_state(self, names: list[str], now: float) -> asyncio.Future[int]:
        """Queue these nodes' latest readings as memory holds them now; a failed write leaves them
        due again (logged, counted in state_failures)."""
        nodes = [self.fleet.nodes[n] for n in names if n in self.fleet.nodes]
        for node in nodes:
            self.state_saved[node.name] = now
            self.unsaved.discard(node.name)
        gpus = {
            n.name: with_xids(n, self.unsaved_xids.pop(n.name)) for n in nodes if n.name in self.unsaved_xids
        }
        future = self.store.queue_latest(nodes, gpus)

        def settled(done: asyncio.Future[int]) -> None:
            if done.cancelled() or done.exception() is None:
                return
            self.state_failures += 1
            if self.state_failures == 1 or self.state_failures % 1000 == 0:  # a full disk fails them all
                log.warning(
                    "latest readings of %d nodes not stored (%d such writes failed so far; the next "
                    "frame tries again): %s",
                    len(nodes),
                    self.state_failures,
                    done.exception(),
                )
            for node in nodes:
                self.state_saved.pop(node.name, None)
                self.unsaved.add(node.name)

        future.add_done_callback(settled)
        return future

    def forget(self, node: str) -> None:
        """Drop what ingest keeps about a node the controller forgets (limits.forget_after_seconds)."""
        self.last_frame.pop(node, None)
        self.state_saved.pop(node, None)
        self.unsaved.discard(node)
        self.unsaved_xids.pop(node, None)
        self._due.discard(node)

    async def flush_state(self, skip: Collection[str] = ()) -> int:
        """Write every node's latest readings the store does not hold yet (at shutdown), but those in
        `skip`; return how many."""
        if self._gathering is not None:  # (those due are unsaved: written here, or skipped)
            self._gathering.cancel()
            self._gathering, self._due = None, set()
        names = sorted(self.unsaved.difference(skip))
        if names:
            await self.save_state(names, self.clock())
        return len(names)

    async def frame(
        self,
        stream_node: str,
        frame: pb.TelemetryFrame,
        planned: FramePlan | None = None,
        raw: bytes | None = None,
    ) -> int:
        """Store one frame; return the seq to ack (the frame's, or the current position for a duplicate).
        A frame that can never be stored raises RefusedFrame (see ingest_checks.py).

        `planned`: an ingest front already checked its times and GPU indices and planned it from the
        node's state, screening it (controller/fronts/planner.py). `raw`: the frame's bytes as they
        were received (as screened, when planned), spared re-encoding for the detection process."""
        try:
            return await self._frame(stream_node, frame, planned, raw)
        except RefusedFrame:
            self.counters.refused += 1
            raise

    async def _frame(
        self, stream_node: str, frame: pb.TelemetryFrame, planned: FramePlan | None, raw: bytes | None
    ) -> int:
        checks.frame_id(frame)
        if frame.node != stream_node:
            raise RefusedFrame(
                f"frame for node {frame.node!r} on the stream of node {stream_node!r}",
                frame.boot_id,
                frame.seq,
            )
        if planned is None:
            if len({g.index for g in each(frame.gpus)}) != len(frame.gpus):
                raise RefusedFrame(f"frame {frame.seq}: a GPU index appears twice", frame.boot_id, frame.seq)
            checks.frame_times(frame, self.clock(), self.max_clock_skew_seconds)
        # Only this (node, boot)'s position moves: the node is the stream's, the boot the frame's.
        async with self._lock(stream_node):
            key = (stream_node, frame.boot_id)
            acked = self.fleet.acked.get(key, 0)
            if frame.seq <= acked:
                self.counters.duplicates += 1
                return acked
            checks.floor_jump(frame, acked)
            expected = max(acked + 1, frame.spool_floor_seq)
            if frame.seq > expected:
                raise SequenceGap(f"boot {frame.boot_id}: expected frame {expected}, got {frame.seq}")
            now = self.clock()
            plan = planned or plan_changes(self.fleet.nodes[stream_node], frame, now)
            write = write_of(stream_node, frame, plan)
            write.state = self.state_every_seconds <= 0
            await self.store.save_frame(write)
            # With a copy elsewhere, the error counters' trends are kept there only (see `mirror`).
            apply_frame(self.fleet, write, counters=self.mirror is None, links_unchanged=plan.links_unchanged)
            if self.mirror is not None:
                # The bytes as received still are the frame's unless screening cleared a reading.
                cleared = planned is None and (plan.non_finite or plan.implausible)
                data = raw if raw is not None and not cleared else frame.SerializeToString()
                self.mirror.frame(stream_node, plan, data)
            if self.store.owner is not None and not write.state:
                xids = [g.sample for g in write.gpus if g.sample.xid_events]
                if xids:
                    self.unsaved_xids.setdefault(stream_node, []).extend(xids)
            if not write.state and (write.gpus or write.host is not None):
                self._state_changed(stream_node, now)
            self.hub.frame(frame, now)
            self.counters.frames += 1
            if frame.HasField("time"):
                # A clock running ahead would give a negative lag; a histogram has no bucket for it.
                self.lag.observe(max(0.0, now - frame.time.ToNanoseconds() / 1e9))
            self.last_frame[stream_node] = max(self.last_frame.get(stream_node, 0.0), write.time)
            if plan.non_finite:
                count = sum(plan.non_finite.values())
                self.counters.non_finite += count
                log.warning(
                    "node %s frame %d: %d NaN/Inf reading%s stored as missing: %s",
                    stream_node,
                    frame.seq,
                    count,
                    "" if count == 1 else "s",
                    fields_text(plan.non_finite),
                )
            return frame.seq


def fields_text(counts: dict[str, int]) -> str:
    """ "GpuSample.gpm_dram_activity_ratio (x8), HostSample.load1": each field, with its count above one."""
    return ", ".join(f"{name} (x{n})" if n > 1 else name for name, n in sorted(counts.items()))


def with_xids(node: NodeState, samples: list[pb.GpuSample]) -> list[GpuState]:
    """The node's GPU readings, each carrying the XID events of every sample of that GPU in
    `samples` (the frames since they were last written), in order."""
    events: dict[int, list[pb.XidEvent]] = {}
    for sample in samples:
        events.setdefault(sample.index, []).extend(sample.xid_events)
    states = []
    for state in node.gpus.values():
        mine = events.get(state.index)
        if not mine or list(state.sample.xid_events) == mine:
            states.append(state)
            continue
        sample = pb.GpuSample()
        sample.CopyFrom(state.sample)
        del sample.xid_events[:]
        sample.xid_events.extend(mine)
        states.append(GpuState(state.index, sample, state.time, state.held))
    return states
