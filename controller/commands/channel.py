"""The one channel for commands to agents: issue, send, re-send, answer, deadline; every state stored.

- Each command gets an id and a row in the store (controller/store/commands.py) BEFORE it is put on
  the node's stream; every state change is stored too: pending -> sent -> running -> succeeded |
  failed | timed_out | cancelled.
- A node has one command stream, its newest: a second stream saying Hello with the same node name
  replaces the first, which is closed with ABORTED ("replaced by a newer stream for node X from
  PEER"). Commands go to the newest stream only.
- On every stream (a reconnect, or a restarted controller that reloaded its open commands) the
  node's unfinished commands are sent again with the SAME id; the agent runs each id once and
  answers a repeat with the result it kept. A command sent to an agent boot that has gone (the
  agent restarted) failed ("restarted"); one past its deadline is timed_out.
- At most one mutating command (kinds.py) is in flight per node: a second is refused with
  FailedPrecondition naming the one in flight.

Lives on the event loop; no locking.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from controller.commands.kinds import KINDS, CommandKind, kind_of
from controller.errors import FailedPrecondition, InvalidMessage
from controller.store.commands import CommandRecord
from controller.store.sqlite import Store
from protos.gpufleet.v1 import telemetry_pb2 as pb

if TYPE_CHECKING:
    Outbox = asyncio.Queue[pb.ControllerMessage]

log = logging.getLogger("gpufleet.controller.commands")
KEEP_FINISHED = 512
RESTARTED = "the agent restarted before answering"


@dataclass(eq=False, slots=True)
class NodeStream:
    """One open Telemetry stream: where the node's commands go while it is the newest."""

    node: str
    boot_id: str
    peer: str
    outbox: Outbox
    replaced: asyncio.Event = field(default_factory=asyncio.Event)
    replaced_by: str = ""  # the status details the replaced stream is closed with


class CommandChannel:
    def __init__(
        self, store: Store, clock: Callable[[], float], kinds: dict[str, CommandKind] | None = None
    ) -> None:
        self.store = store
        self.clock = clock
        self.kinds = dict(KINDS if kinds is None else kinds)
        self.streams: dict[str, NodeStream] = {}
        self.open: dict[str, CommandRecord] = {}  # id -> unfinished command, oldest first
        self._finished: OrderedDict[str, CommandRecord] = OrderedDict()
        self._done: dict[str, asyncio.Event] = {}
        self.listeners: list[Callable[[CommandRecord], None]] = []  # told of every finished command

    async def load(self) -> list[CommandRecord]:
        """Take up the commands a previous controller left unfinished: sent on the node's next stream."""
        reloaded = await self.store.open_commands()
        for record in reloaded:
            self.open[record.id] = record
        if reloaded:
            log.info("%d unfinished commands reloaded from the store", len(reloaded))
        return reloaded

    # Streams

    def open_stream(self, hello: pb.Hello, outbox: Outbox, peer: str) -> NodeStream:
        """The node's newest stream: replaces an older one, and gets the node's unfinished commands."""
        stream = NodeStream(hello.node, hello.boot_id, peer, outbox)
        old = self.streams.get(hello.node)
        if old is not None:
            old.replaced_by = f"replaced by a newer stream for node {hello.node} from {peer}"
            old.replaced.set()
            log.warning("node %s: stream from %s replaced by a newer one from %s", hello.node, old.peer, peer)
        self.streams[hello.node] = stream
        now = self.clock()
        for record in self.in_flight(hello.node):
            if now >= record.deadline:
                self._finish(record, "timed_out", error=_late(record), failure="timeout")
            elif record.state != "pending" and record.boot_id != hello.boot_id:
                self._finish(record, "failed", error=RESTARTED, failure="restarted")
            else:
                self._send(record, stream, again=record.state != "pending")
        return stream

    def close_stream(self, stream: NodeStream) -> None:
        if self.streams.get(stream.node) is stream:  # a newer stream of the same node stays
            del self.streams[stream.node]

    def reachable(self, node: str) -> bool:
        """A stream of the node is open: a command issued now goes out at once."""
        return node in self.streams

    # Issuing

    async def issue(
        self, node: str, command: pb.Command, requester: str, *, timeout_seconds: float | None = None
    ) -> CommandRecord:
        """Store the command, then put it on the node's stream. FailedPrecondition: the node is not
        connected, or (for a mutating command) one is in flight; InvalidMessage: an unknown kind."""
        kind = self.kinds.get(kind_of(command))
        if kind is None:
            raise InvalidMessage(f"unknown command kind {kind_of(command)!r}")
        if node not in self.streams:
            raise FailedPrecondition(f"node {node} is not connected")
        if kind.mutating:
            busy = next((r for r in self.in_flight(node) if self._mutating(r)), None)
            if busy is not None:
                raise FailedPrecondition(
                    f"node {node} already has a mutating command in flight: {busy.id} "
                    f"({busy.kind}, {busy.state}, requested by {busy.requester})"
                )
        command = _copy(command)
        command.id = command.id or uuid.uuid4().hex
        if command.id in self.open or command.id in self._finished:
            raise InvalidMessage(f"command id {command.id} is already used")
        now = self.clock()
        timeout = kind.timeout_seconds if timeout_seconds is None else timeout_seconds
        record = CommandRecord(command.id, node, kind.name, requester, now, now + timeout, command)
        self.open[record.id] = record  # before the await: a concurrent issue sees it in flight
        try:
            await self.store.save_command(
                record
            )  # stored before sent: a restart neither loses nor repeats it
        except BaseException:
            del self.open[record.id]
            raise
        stream = self.streams.get(node)
        if record.state == "pending" and stream is not None:  # (a new stream may have sent it already)
            self._send(record, stream)
        return record

    def _send(self, record: CommandRecord, stream: NodeStream, *, again: bool = False) -> None:
        record.state, record.sent, record.boot_id = "sent", self.clock(), stream.boot_id
        stream.outbox.put_nowait(pb.ControllerMessage(command=record.command))
        self._persist(record)
        log.info(
            "node %s: command %s (%s, %s) %s",
            record.node,
            record.id,
            record.kind,
            record.requester,
            "sent again (same id)" if again else "sent",
        )

    # Answers and deadlines

    def started(self, node: str, command_id: str) -> None:
        record = self.open.get(command_id)
        if record is not None and record.node == node and record.state == "sent":
            record.state = "running"
            self._persist(record)

    def answered(self, node: str, result: pb.CommandResult) -> CommandRecord | None:
        """The node's CommandResult; None when it answers no open command of this node (a late repeat)."""
        record = self.open.get(result.command_id)
        if record is None or record.node != node:
            log.info("node %s: answer to command %s, which is not in flight", node, result.command_id)
            return None
        state = "succeeded" if result.ok else "failed"
        self._finish(record, state, error=result.error, result=result, failure="" if result.ok else "error")
        return record

    def expire(self, now: float | None = None) -> list[CommandRecord]:
        """Time out the commands past their deadline."""
        now = self.clock() if now is None else now
        late = [r for r in self.open.values() if now >= r.deadline]
        for record in late:
            self._finish(record, "timed_out", error=_late(record), failure="timeout")
        return late

    def cancel(self, command_id: str, why: str) -> CommandRecord | None:
        """Give up on a command not yet sent (a sent one may be running: it runs to its end)."""
        record = self.open.get(command_id)
        if record is None or record.state != "pending":
            return None
        self._finish(record, "cancelled", error=why, failure="cancelled")
        return record

    def _finish(
        self,
        record: CommandRecord,
        state: str,
        *,
        error: str = "",
        result: pb.CommandResult | None = None,
        failure: str = "",
    ) -> None:
        record.state, record.finished, record.error, record.failure = state, self.clock(), error, failure
        if result is not None:
            record.result = result
        del self.open[record.id]
        self._finished[record.id] = record
        while len(self._finished) > KEEP_FINISHED:
            self._finished.popitem(last=False)
        self._persist(record)
        if state == "succeeded":
            log.info("node %s: command %s (%s) succeeded", record.node, record.id, record.kind)
        else:
            log.warning("node %s: command %s (%s) %s: %s", record.node, record.id, record.kind, state, error)
        for listener in self.listeners:
            listener(record)
        done = self._done.pop(record.id, None)
        if done is not None:
            done.set()

    def _persist(self, record: CommandRecord) -> None:
        self.store.save_command(record).add_done_callback(_log_failure)

    # Queries

    def _mutating(self, record: CommandRecord) -> bool:
        kind = self.kinds.get(record.kind)
        return kind is None or kind.mutating  # a kind this controller does not know: assume it mutates

    def in_flight(self, node: str) -> list[CommandRecord]:
        return [r for r in self.open.values() if r.node == node]

    def get(self, command_id: str) -> CommandRecord | None:
        return self.open.get(command_id) or self._finished.get(command_id)

    async def wait(self, record: CommandRecord, timeout: float) -> None:
        """Return when `record` is finished or `timeout` passed."""
        if not record.open:
            return
        done = self._done.setdefault(record.id, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), timeout)

    async def list(self, node: str = "", limit: int = 100) -> list[CommandRecord]:
        """Newest first, from the store (commands of earlier controller runs included)."""
        return await self.store.list_commands(node, limit)


def _late(record: CommandRecord) -> str:
    return f"no answer within {record.deadline - record.created:.0f}s"


def _copy(command: pb.Command) -> pb.Command:
    out = pb.Command()
    out.CopyFrom(command)
    return out


def _log_failure(future: asyncio.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("command state not stored: %s", future.exception())
