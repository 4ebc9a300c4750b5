"""Sending probe commands to connected nodes: on connect, on schedule and for operators.

The thin adapter around the pure scheduler (controller/fleet/probe_schedule.py): it holds each
connected node's stream outbox, queues RunProbes commands on it, and books them in ProbeCommands
(in flight, answered, results by command id). Runs on the event loop, like the rest of the app.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from controller.config import ControllerConfig
from controller.errors import FailedPrecondition, InvalidMessage, NotFound
from controller.fleet.model import Fleet, NodeState
from controller.fleet.probe_schedule import CAPABILITY, NODE_LEVEL_PROBES, ProbePlan, ProbeTarget, plan_probes
from controller.probe_commands import ProbeCommand, ProbeCommands
from protos.gpufleet.v1 import telemetry_pb2 as pb

if TYPE_CHECKING:
    Outbox = asyncio.Queue[pb.ControllerMessage]

log = logging.getLogger("gpufleet.controller.probes")


class Probing:
    def __init__(
        self, config: ControllerConfig, fleet: Callable[[], Fleet], clock: Callable[[], float]
    ) -> None:
        self.config = config
        self._fleet = fleet  # the app replaces its Fleet when it loads the store: always ask
        self.clock = clock
        self.commands = ProbeCommands()
        self._outboxes: dict[str, Outbox] = {}
        self._asked_on_connect: set[tuple[str, str]] = set()

    # Streams

    def stream_opened(self, hello: pb.Hello, outbox: Outbox) -> None:
        """The node's newest stream: commands go to it from now on."""
        self._outboxes[hello.node] = outbox
        gone = self.commands.restarted(hello.node, hello.boot_id)
        if gone is not None:
            log.warning("node %s: probe command %s lost: %s", hello.node, gone.id, gone.error)

    def reachable(self, node: str) -> bool:
        """A stream of the node is open: a command can be queued for it."""
        return node in self._outboxes

    def stream_closed(self, node: str, outbox: Outbox) -> None:
        if self._outboxes.get(node) is outbox:  # a newer stream of the same node stays
            del self._outboxes[node]

    def command_result(self, node: str, result: pb.CommandResult) -> None:
        command = self.commands.answered(node, result)
        if command is None:
            log.info(
                "node %s: answer to command %s, which is not a probe command in flight",
                node,
                result.command_id,
            )
        elif result.ok:
            log.info("node %s: probe command %s (%s) done", node, command.id, command.reason)
        else:
            log.warning(
                "node %s: probe command %s (%s) failed: %s", node, command.id, command.reason, result.error
            )

    def frame_results(self, node: str, frame: pb.TelemetryFrame) -> None:
        if frame.probes:
            self.commands.add_results(node, frame.probes)

    # Sending

    def send(self, node_name: str, run: pb.RunProbes, reason: str, why: str = "") -> ProbeCommand:
        """Queue `run` on the node's stream; NotFound / FailedPrecondition / InvalidMessage say why not."""
        node = self._fleet().nodes.get(node_name)
        if node is None:
            raise NotFound(f"node {node_name!r} is not known to this controller")
        outbox = self._outboxes.get(node_name)
        if outbox is None or not node.connected:
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
        self.commands.start(command, _targets(node, run))
        outbox.put_nowait(pb.ControllerMessage(command=pb.Command(id=command.id, run_probes=run)))
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

    def on_connect(self, hello: pb.Hello) -> ProbeCommand | None:
        """Ask a newly booted agent for a probe run, once per boot, when it can run probes."""
        key = (hello.node, hello.boot_id)
        if (
            not self.config.probes.on_connect
            or CAPABILITY not in hello.capabilities
            or key in self._asked_on_connect
        ):
            return None
        self._asked_on_connect.add(key)
        try:
            command = self.send(hello.node, pb.RunProbes(suite=self.config.probes.suite), "on_connect")
        except FailedPrecondition as exc:  # e.g. a probe still in flight from before a reconnect
            log.info("node %s: no probe on connect: %s", hello.node, exc)
            return None
        return command

    # The schedule

    def schedule_pass(self) -> list[ProbeCommand]:
        """Give up on commands past their timeout, then start the runs the scheduler asks for."""
        cfg, now = self.config.probes, self.clock()
        for command in self.commands.expire(now, cfg.timeout_seconds):
            log.warning(
                "node %s: probe command %s (%s): %s", command.node, command.id, command.reason, command.error
            )
        if not cfg.periodic:
            return []
        plans = plan_probes(
            self._fleet(),
            in_flight=self.commands.in_flight.keys(),
            attempts=self.commands.attempts,
            now=now,
            config=cfg,
            max_reading_age=self.config.stale_after_seconds,
        )
        sent = []
        for plan in plans:
            run = pb.RunProbes(probes=plan.probes, gpus=plan.gpus, suite=cfg.suite)
            try:
                sent.append(self.send(plan.node, run, "periodic", _described(plan)))
            except (FailedPrecondition, NotFound) as exc:  # e.g. its stream closed a moment ago
                log.info("node %s: periodic probe not sent: %s", plan.node, exc)
        return sent

    async def schedule_forever(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                self.schedule_pass()
            except Exception:  # a bug in one pass must not end scheduling for good
                log.exception("probe scheduling pass failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.config.probes.check_every_seconds)


def _check_request(node: NodeState, run: pb.RunProbes) -> None:
    present = {g.index for g in node.hello.inventory.gpus}
    missing = sorted(set(run.gpus) - present)
    if missing:
        have = ", ".join(map(str, sorted(present)))
        raise InvalidMessage(f"node {node.name} has no GPU {', '.join(map(str, missing))} (it has: {have})")
    offered = set(node.hello.probes)
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
    per_gpu = not names or bool(names - NODE_LEVEL_PROBES)
    node_level = not run.gpus and (not names or bool(names & NODE_LEVEL_PROBES))
    gpus = list(run.gpus) or [g.index for g in node.hello.inventory.gpus]
    targets: list[ProbeTarget] = [(node.name, g) for g in gpus] if per_gpu else []
    return [*targets, (node.name, None)] if node_level else targets


def _described(plan: ProbePlan) -> str:
    late = "never probed" if plan.overdue_seconds == float("inf") else f"{plan.overdue_seconds:.0f}s overdue"
    return f"{plan.why}, {late}"
