"""Sending probe commands to connected nodes: on connect, on schedule and for operators.

The thin adapter around the pure scheduler (controller/fleet/probe_schedule.py): it issues RunProbes
commands through the command channel (controller/commands/: stored, sent, re-sent, timed out) and
books what is particular to probing in ProbeCommands (one run per node, attempts, results by
command id, the metrics' counters). Runs on the event loop, like the rest of the app.

On-connect runs obey probes.max_fleet_share as periodic ones do: when a fleet (re)connects at once,
at most max(1, floor(share x connected nodes)) probe together, and the others wait their turn in
connect order (a waiting node that disconnects, reboots or goes under maintenance is dropped; its
next Hello asks again). A finished run frees its slot for the next waiting node at once, and every
schedule pass gives waiting nodes the free slots before the periodic plan.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Collection, Iterable

from controller.commands.channel import CommandChannel
from controller.config import ControllerConfig
from controller.errors import FailedPrecondition, InvalidMessage, NotFound
from controller.fleet.model import Fleet, NodeState
from controller.fleet.probe_info import node_level_probes, probe_infos
from controller.fleet.probe_schedule import CAPABILITY, ProbePlan, ProbeTarget, fleet_slots, plan_probes
from controller.probe_commands import ProbeCommand, ProbeCommands
from controller.store.commands import CommandRecord
from protos.gpufleet.v1 import telemetry_pb2 as pb

log = logging.getLogger("gpufleet.controller.probes")
KIND = "run_probes"
REQUESTERS = {
    "periodic": "scheduler",
    "on_connect": "on_connect",
    "operator": "operator",
    "recovery": "recovery",  # a drained node whose findings cleared (kube/recovery.py)
}  # reason -> requester


class Probing:
    def __init__(
        self,
        config: ControllerConfig,
        fleet: Callable[[], Fleet],
        clock: Callable[[], float],
        channel: CommandChannel,
    ) -> None:
        self.config = config
        self._fleet = fleet  # the app replaces its Fleet when it loads the store: always ask
        self.clock = clock
        self.channel = channel
        self.commands = ProbeCommands()
        self._asked_on_connect: set[tuple[str, str]] = set()
        self.waiting: dict[str, str] = {}  # on-connect runs held for a slot: node -> boot id, in order
        self._draining: set[asyncio.Task[list[ProbeCommand]]] = set()
        # Nodes under maintenance (the app sets it): no probe on schedule or on connect; an
        # operator's probe-node still goes.
        self.paused: Callable[[], Collection[str]] = lambda: ()
        channel.listeners.append(self._finished)

    def adopt(self, records: Iterable[CommandRecord]) -> None:
        """Probe commands a previous controller left unfinished: in flight here too (one run per node)."""
        for record in records:
            if record.kind != KIND or record.node in self.commands.in_flight:
                continue
            command = ProbeCommand(
                id=record.id,
                node=record.node,
                boot_id=record.boot_id,
                reason=_reason(record.requester),
                sent_at=record.sent or record.created,
                run=record.command.run_probes,
            )
            self.commands.start(command, (), count=False)

    def reachable(self, node: str) -> bool:
        """A stream of the node is open: a command can be queued for it."""
        return self.channel.reachable(node)

    def _finished(self, record: CommandRecord) -> None:
        command = self.commands.get(record.id) if record.kind == KIND else None
        if command is not None:
            ok = record.state == "succeeded"
            self.commands.finish(command, ok=ok, error=record.error, failure="" if ok else record.failure)
            if self.waiting:
                self._drain_soon()

    def _drain_soon(self) -> None:
        """Start the next waiting on-connect runs in a task (listeners are called synchronously)."""
        try:
            task = asyncio.get_running_loop().create_task(self.drain_waiting())
        except RuntimeError:  # no loop (a synchronous caller): the next schedule pass drains
            return
        self._draining.add(task)
        task.add_done_callback(self._drained)

    def _drained(self, task: asyncio.Task[list[ProbeCommand]]) -> None:
        self._draining.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("starting waiting probe runs failed", exc_info=task.exception())

    def slots_left(self) -> int:
        """How many more nodes may start probing now (probes.max_fleet_share of the connected ones)."""
        allowed = fleet_slots(len(self.channel.streams), self.config.probes.max_fleet_share)
        return allowed - len(self.commands.in_flight)

    def frame_results(self, node: str, frame: pb.TelemetryFrame) -> None:
        if frame.probes:
            self.commands.add_results(node, frame.probes)

    # Sending

    async def send(
        self, node_name: str, run: pb.RunProbes, reason: str, why: str = "", requester: str = ""
    ) -> ProbeCommand:
        """Issue `run` to the node; NotFound / FailedPrecondition / InvalidMessage say why not.
        `reason` is the metrics' label; `requester` (default: reason) is stored with the command."""
        node = self._fleet().nodes.get(node_name)
        if node is None:
            raise NotFound(f"node {node_name!r} is not known to this controller")
        if not self.channel.reachable(node_name) or not node.connected:
            raise FailedPrecondition(f"node {node_name} is not connected")
        if CAPABILITY not in node.hello.capabilities:
            raise FailedPrecondition(f"node {node_name} cannot run probes (its agent offers none)")
        _check_request(node, run)
        busy = self.commands.in_flight.get(node_name)
        if busy is not None:
            raise FailedPrecondition(
                f"node {node_name} is already probing (command {busy.id}, {busy.reason})"
            )
        command = ProbeCommand(
            id=uuid.uuid4().hex,
            node=node_name,
            boot_id=node.boot_id,
            reason=reason,
            sent_at=self.clock(),
            run=run,
        )
        self.commands.start(command, _targets(node, run))  # before the await: the node is busy now
        try:
            await self.channel.issue(
                node_name,
                pb.Command(id=command.id, run_probes=run),
                requester or REQUESTERS.get(reason, reason),
                timeout_seconds=self.config.probes.timeout_seconds,
            )
        except BaseException:
            self.commands.discard(command)
            raise
        where = f"GPUs {','.join(map(str, run.gpus))}" if run.gpus else "every GPU"
        what = f"{','.join(run.probes) or 'default suite'} on {where}"
        log.info(
            "node %s: probe command %s sent (%s%s): %s%s",
            node_name,
            command.id,
            reason,
            f", {why}" if why else "",
            what,
            ", forced" if run.force else "",
        )
        return command

    async def on_connect(self, hello: pb.Hello) -> ProbeCommand | None:
        """Ask a newly booted agent for a probe run, once per boot, when it can run probes."""
        key = (hello.node, hello.boot_id)
        if (
            not self.config.probes.on_connect
            or CAPABILITY not in hello.capabilities
            or key in self._asked_on_connect
        ):
            return None
        if hello.node in self.paused():
            log.info("node %s: no probe on connect: it is under maintenance", hello.node)
            return None
        self._asked_on_connect.add(key)
        if self.slots_left() <= 0 or self.waiting:  # others waited first: they go first
            self.waiting.pop(hello.node, None)  # a new boot of a waiting node joins at the end
            self.waiting[hello.node] = hello.boot_id
            log.debug(  # a storm would log a line per node: the waiting count is a metric
                "node %s: probe on connect waits for a slot (%d waiting, %d probing, max_fleet_share %g)",
                hello.node,
                len(self.waiting),
                len(self.commands.in_flight),
                self.config.probes.max_fleet_share,
            )
            started = await self.drain_waiting()
            return next((c for c in started if c.node == hello.node), None)
        return await self._probe_on_connect(hello.node)

    async def _probe_on_connect(self, node: str) -> ProbeCommand | None:
        try:
            return await self.send(node, pb.RunProbes(suite=self.config.probes.suite), "on_connect")
        except FailedPrecondition as exc:  # e.g. a probe still in flight from before a reconnect
            log.info("node %s: no probe on connect: %s", node, exc)
            return None

    async def recovery_probe(self, node: str) -> ProbeCommand:
        """The default suite on a drained node whose findings just cleared: its uncordon waits for
        a probe result newer than the clear, which the schedule would bring only after
        probes.interval_seconds (30 min by default). Outside the fleet share, as an operator's probe
        is: one per drained node, and the breaker bounds those. FailedPrecondition when it cannot
        go now (not connected, already probing)."""
        return await self.send(node, pb.RunProbes(suite=self.config.probes.suite), "recovery")

    async def drain_waiting(self) -> list[ProbeCommand]:
        """Start waiting on-connect runs, oldest first, while slots are free."""
        sent: list[ProbeCommand] = []
        while self.waiting and self.slots_left() > 0:
            node, boot_id = next(iter(self.waiting.items()))
            del self.waiting[node]
            state = self._fleet().nodes.get(node)
            if (
                state is None
                or state.boot_id != boot_id
                or not state.connected
                or not self.channel.reachable(node)
                or node in self.paused()
            ):
                continue  # gone, rebooted (its new Hello asks again) or under maintenance
            command = await self._probe_on_connect(node)
            if command is not None:
                sent.append(command)
        return sent

    # The schedule

    async def schedule_pass(self) -> list[ProbeCommand]:
        """Time out commands past their deadline, then start the runs the scheduler asks for."""
        cfg, now = self.config.probes, self.clock()
        self.channel.expire(now)
        started = await self.drain_waiting()  # nodes that connected while every slot was taken
        if not cfg.periodic:
            return started
        plans = plan_probes(
            self._fleet(),
            in_flight=self.commands.in_flight.keys(),
            attempts=self.commands.attempts,
            now=now,
            config=cfg,
            max_reading_age=self.config.stale_after_seconds,
            skip=self.paused(),
        )
        sent = started
        for plan in plans:
            run = pb.RunProbes(probes=plan.probes, gpus=plan.gpus, suite=cfg.suite)
            try:
                sent.append(await self.send(plan.node, run, "periodic", _described(plan)))
            except (FailedPrecondition, NotFound) as exc:  # e.g. its stream closed a moment ago
                log.info("node %s: periodic probe not sent: %s", plan.node, exc)
        return sent

    async def schedule_forever(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.schedule_pass()
            except Exception:  # a bug in one pass must not end scheduling for good
                log.exception("probe scheduling pass failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.config.probes.check_every_seconds)


def _reason(requester: str) -> str:
    """The metrics' reason for a stored requester: scheduler -> periodic, operator:<who> -> operator."""
    prefix = requester.split(":", 1)[0]
    return next((r for r, q in REQUESTERS.items() if q == prefix), "operator")


def _check_request(node: NodeState, run: pb.RunProbes) -> None:
    present = {g.index for g in node.hello.inventory.gpus}
    missing = sorted(set(run.gpus) - present)
    if missing:
        have = ", ".join(map(str, sorted(present)))
        raise InvalidMessage(f"node {node.name} has no GPU {', '.join(map(str, missing))} (it has: {have})")
    offered = set(probe_infos(node.hello))
    unknown = [p for p in run.probes if p not in offered]
    if unknown:
        have = ", ".join(sorted(offered)) or "none"
        raise InvalidMessage(
            f"node {node.name} does not offer probe {', '.join(unknown)} (it offers: {have})"
        )


def _targets(node: NodeState, run: pb.RunProbes) -> list[ProbeTarget]:
    """What a run probes, for the scheduler's book of attempts. A node-level probe counts only on
    every GPU: an all-reduce over some of them is not comparable with the node's usual one."""
    names = set(run.probes)
    whole_node = node_level_probes(node.hello)  # as the node's Hello describes its probes
    per_gpu = not names or bool(names - whole_node)
    node_level = not run.gpus and (not names or bool(names & whole_node))
    gpus = list(run.gpus) or [g.index for g in node.hello.inventory.gpus]
    targets: list[ProbeTarget] = [(node.name, g) for g in gpus] if per_gpu else []
    return [*targets, (node.name, None)] if node_level else targets


def _described(plan: ProbePlan) -> str:
    late = "never probed" if plan.overdue_seconds == float("inf") else f"{plan.overdue_seconds:.0f}s overdue"
    return f"{plan.why}, {late}"
