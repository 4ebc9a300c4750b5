"""Probe commands the controller has sent: in flight per node, their answers and their results.

The command channel (controller/commands/) stores, sends and finishes every command; this book
keeps what is particular to probing. A command is in flight from the moment it is issued until the
channel finishes it: the node's CommandResult arrived (from the same boot, or from a new boot that
kept its command memory), the node came back with a new boot without that memory (the command died
with the old agent), or its deadline passed. The node's ProbeResults name the command
they answer (command_id); they ride in a frame that arrives just before or just after the
CommandResult, so a waiter gives them a short grace after the answer. Finished commands are kept
(a bounded number) so a late waiter or a late frame still finds them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from controller.fleet.probe_schedule import ProbeTarget
from protos.gpufleet.v1 import telemetry_pb2 as pb

log = logging.getLogger("gpufleet.controller.probes")

REASONS = ("periodic", "on_connect", "operator", "recovery")  # why a command was sent: the metrics' `reason`
FAILURES = ("error", "timeout", "restarted")  # how one failed: the metrics' `failure`
RESULTS_GRACE_SECONDS = 3.0  # after the answer, how long a waiter waits for the results' frame
KEEP_FINISHED = 256


@dataclass(slots=True)
class ProbeCommand:
    id: str
    node: str
    boot_id: str
    reason: str
    sent_at: float
    run: pb.RunProbes
    done: bool = False  # the node answered (or the command was given up: see `failure`)
    ok: bool = False
    error: str = ""
    failure: str = ""  # one of FAILURES when it did not succeed
    results: dict[tuple[str, str, int | None], pb.ProbeResult] = field(default_factory=dict)
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    results_seen: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def answered(self) -> bool:
        """The node sent its CommandResult (rather than the command being given up)."""
        return self.done and self.failure not in ("timeout", "restarted")

    def result_list(self) -> list[pb.ProbeResult]:
        return [
            self.results[k]
            for k in sorted(self.results, key=lambda k: (k[0], k[1], -1 if k[2] is None else k[2]))
        ]


class ProbeCommands:
    """The controller's book of probe commands. Lives on the event loop; no locking needed."""

    def __init__(self, keep_finished: int = KEEP_FINISHED) -> None:
        self.in_flight: dict[str, ProbeCommand] = {}  # node -> its command in flight
        self.attempts: dict[ProbeTarget, float] = {}  # when a command last asked for each target
        self.sent = dict.fromkeys(REASONS, 0)
        self.failed = {(r, f): 0 for r in REASONS for f in FAILURES}
        self._recent: OrderedDict[str, ProbeCommand] = OrderedDict()
        self._keep = keep_finished

    def get(self, command_id: str) -> ProbeCommand | None:
        return self._recent.get(command_id)

    def recent(self) -> list[ProbeCommand]:
        """The commands kept, oldest first."""
        return sorted(self._recent.values(), key=lambda c: c.sent_at)

    def start(self, command: ProbeCommand, targets: Iterable[ProbeTarget], *, count: bool = True) -> None:
        """Record a command about to be issued (count=False: one taken up from a previous controller)."""
        if command.node in self.in_flight:
            raise ValueError(
                f"node {command.node} already has probe command {self.in_flight[command.node].id}"
            )
        self.in_flight[command.node] = command
        self._recent[command.id] = command
        while len(self._recent) > self._keep:
            oldest = next(iter(self._recent))
            if self._recent[oldest].done:
                del self._recent[oldest]
            else:
                self._recent.move_to_end(oldest)  # in flight: kept; at most one per node
                break
        for target in targets:
            self.attempts[target] = command.sent_at
        if count:
            self.sent[command.reason] += 1

    def add_results(self, node: str, results: Iterable[pb.ProbeResult]) -> None:
        """Probe results from one of the node's frames; those naming a command of ours are kept with it."""
        for result in results:
            command = self._recent.get(result.command_id) if result.command_id else None
            if command is None or command.node != node:
                continue
            key = (result.probe, result.variant, result.gpu if result.HasField("gpu") else None)
            command.results[key] = result  # a frame resent after a reconnect replaces, never adds
            command.results_seen.set()

    def finish(self, command: ProbeCommand, *, ok: bool, error: str, failure: str) -> None:
        """The command channel finished the command: answered, timed out or the agent restarted."""
        if command.done:
            return
        command.done, command.ok, command.error, command.failure = True, ok, error, failure
        if self.in_flight.get(command.node) is command:
            del self.in_flight[command.node]
        if failure:
            self.failed[(command.reason, failure if failure in FAILURES else "error")] += 1
        command.finished.set()

    def discard(self, command: ProbeCommand) -> None:
        """A command that was never sent (the store refused it): as if it had not been started."""
        if self.in_flight.get(command.node) is command:
            del self.in_flight[command.node]
        if self._recent.pop(command.id, None) is not None:
            self.sent[command.reason] -= 1

    async def wait(self, command: ProbeCommand, timeout: float, grace: float = RESULTS_GRACE_SECONDS) -> None:
        """Return when `command` is answered and its results are in (or `grace` after the answer
        passed without them), or when `timeout` passes, whichever is first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(command.finished.wait(), timeout)
        if not command.done or command.failure in ("timeout", "restarted"):
            return
        left = min(grace, max(0.0, deadline - loop.time()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(command.results_seen.wait(), left)
