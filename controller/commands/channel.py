"""The one channel for commands to agents: issue, send, re-send, answer, deadline; every state stored.

- Each command gets an id and a row in the store (controller/store/commands.py) BEFORE it is put on
  the node's stream: a command becomes visible to the node's streams only once its row is
  committed (a failed write is reported to the caller and the command never goes out). Every
  state change is stored too: pending -> sent -> running -> succeeded | failed | timed_out |
  cancelled.
- A node has one command stream, its newest: a second stream saying Hello with the same node name
  replaces the first, which is closed with ABORTED ("replaced by a newer stream for node X from
  PEER"). Commands go to the newest stream only.
- On every stream (a reconnect, or a restarted controller that reloaded its open commands) the
  node's unfinished commands are sent again with the SAME id; the agent runs each id once and
  answers a repeat with the result it kept. When the agent itself restarted (a new boot id) and
  says `command_memory` in Hello.capabilities (it keeps ids and results on disk), its unfinished
  commands are sent to the new boot, same ids: it answers from disk (the stored result; failed
  "interrupted" for one it began and did not finish) or runs one it never received. An agent
  without that memory cannot tell: its unfinished commands fail ("restarted", the metrics'
  failure label) without being sent again.
- Every command carries what is left of its deadline (`Command.seconds_left`): an agent that
  has not started it by then answers failed ("deadline passed before it started"). Past its
  deadline the command is timed_out here. A late answer is still recorded against it: its real
  outcome (succeeded or failed, with the result) replaces timed_out, with a note that it came
  after the deadline.
- At most one mutating command (kinds.py) per node at a time: a second is refused with
  FailedPrecondition naming the first. A mutating command that timed out after it was sent keeps
  holding the node (the agent may still be applying it) until the agent answers (on every new
  stream it is sent again, same id, so the agent answers it from its memory, or refuses it as
  too late) or the node comes back with a new boot; the hold survives a controller restart.

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
from controller.commands.open_commands import OpenCommands
from controller.errors import FailedPrecondition, InvalidMessage
from controller.store.commands import CommandRecord
from controller.store.store import Store
from protos.gpufleet.v1 import telemetry_pb2 as pb

if TYPE_CHECKING:
    Outbox = asyncio.Queue[pb.ControllerMessage]

log = logging.getLogger("gpufleet.controller.commands")
KEEP_FINISHED = 512
LATE_WATCH_SECONDS = 3600.0  # how long past its deadline another replica's late answer is looked for
LOG_ERROR_CHARS = 160  # of a failed command's error in its warning line
RESTARTED = "the agent restarted before answering"
MEMORY_CAPABILITY = "command_memory"  # Hello.capabilities: the agent keeps command ids and results on disk
# In an outbox: look at the stream again (replaced, or its reader ended); never sent. A replaced
# stream gets one at once, so its handler wakes without a task of its own waiting on `replaced`.
WAKE = pb.ControllerMessage()


@dataclass(eq=False, slots=True)
class NodeStream:
    """One open Telemetry stream: where the node's commands go while it is the newest."""

    node: str
    boot_id: str
    peer: str
    outbox: Outbox
    remembers: bool = False  # the agent keeps command ids and results across its restarts
    replaced: asyncio.Event = field(default_factory=asyncio.Event)
    replaced_by: str = ""  # the status details the replaced stream is closed with
    replaces: str = ""  # the peer of the older stream of the node this one replaced, if it did


class CommandChannel:
    def __init__(
        self, store: Store, clock: Callable[[], float], kinds: dict[str, CommandKind] | None = None
    ) -> None:
        self.store = store
        self.clock = clock
        self.kinds = dict(KINDS if kinds is None else kinds)
        self.streams: dict[str, NodeStream] = {}
        self.open = OpenCommands()  # id -> unfinished command, oldest first; by node too
        self.held: dict[str, CommandRecord] = {}  # node -> its timed-out mutating command, unanswered
        self._issuing: dict[str, CommandRecord] = {}  # id -> command whose row is being written
        self._finished: OrderedDict[str, CommandRecord] = OrderedDict()
        self._done: dict[str, asyncio.Event] = {}
        self.listeners: list[Callable[[CommandRecord], None]] = []  # told of every finished command
        # replica_ingest (controller/replicas.py): whether a node streams to another replica, whose
        # channel sends it the commands issued here (take_up) and stores their answers (settle).
        self.elsewhere: Callable[[str], bool] | None = None
        self.taken_up: set[str] = set()  # ids of open commands another replica issued, sent from here
        # Commands issued here that timed out while another replica sent them: their late answer,
        # stored by that replica, is taken up here (settle). id -> record, oldest first.
        self.late_elsewhere: OrderedDict[str, CommandRecord] = OrderedDict()

    async def load(self) -> list[CommandRecord]:
        """Take up the commands a previous controller left unfinished: sent on the node's next
        stream, or at once on one open here already (a standby that leads keeps its agents' streams:
        what it took up there stays as it is, now its own to finish). Mutating commands that timed
        out unanswered hold their nodes again."""
        reloaded, unanswered = await self.store.load_commands()
        # (one this replica finished as a standby may read unfinished: its row's write still queued)
        new = [r for r in reloaded if r.id not in self.open and r.id not in self._finished]
        for record in new:
            self.open[record.id] = record
        self.taken_up.clear()
        for record in unanswered:
            if self._mutating(record) and record.sent is not None:
                self.held[record.node] = record  # the newest per node (oldest first)
                self._finished[record.id] = record  # its late answer is recorded against it
        for node in sorted({r.node for r in new} | set(self.held)):
            stream = self.streams.get(node)
            if stream is not None:
                self._deliver(stream, [r for r in new if r.node == node])
        if reloaded:
            log.info("%d unfinished commands reloaded from the store", len(reloaded))
        return reloaded

    # Streams

    def open_stream(self, hello: pb.Hello, outbox: Outbox, peer: str) -> NodeStream:
        """The node's newest stream: replaces an older one, and gets the node's unfinished commands."""
        stream = NodeStream(hello.node, hello.boot_id, peer, outbox, MEMORY_CAPABILITY in hello.capabilities)
        old = self.streams.get(hello.node)
        if old is not None:
            old.replaced_by = f"replaced by a newer stream for node {hello.node} from {peer}"
            old.replaced.set()
            old.outbox.put_nowait(WAKE)
            stream.replaces = old.peer  # the caller logs it (controller/connection_log.py)
        self.streams[hello.node] = stream
        self._deliver(stream, self.in_flight(hello.node))
        return stream

    def _deliver(self, stream: NodeStream, records: list[CommandRecord]) -> None:
        """`records` (the node's unfinished commands) sent on its stream, or finished when they no
        longer can be; its timed-out mutating command sent again, to learn how it ended."""
        now = self.clock()
        for record in records:
            if now >= record.deadline:
                self._time_out(record)
            elif record.state != "pending" and record.boot_id != stream.boot_id and not stream.remembers:
                self._finish(record, "failed", error=RESTARTED, failure="restarted")
            else:
                self._send(record, stream, again=record.state != "pending")
        held = self.held.get(stream.node)
        if held is not None:
            if held.boot_id != stream.boot_id:  # the agent that may have been applying it is gone
                del self.held[stream.node]
                log.info("node %s: new boot, timed-out command %s no longer holds it", stream.node, held.id)
            if held.boot_id == stream.boot_id or stream.remembers:
                self._send(held, stream, again=True)  # to learn how it ended (a late answer)

    def close_stream(self, stream: NodeStream) -> None:
        if self.streams.get(stream.node) is stream:  # a newer stream of the same node stays
            del self.streams[stream.node]

    def reachable(self, node: str) -> bool:
        """A stream of the node is open, here or (replica_ingest) on another replica: a command issued
        now goes out at once (from there, within a few seconds)."""
        return node in self.streams or (self.elsewhere is not None and self.elsewhere(node))

    # Commands across replicas (replica_ingest): the store carries them both ways

    def delegated(self) -> list[CommandRecord]:
        """Open commands issued here for nodes that stream elsewhere: their replica sends them; and
        those timed out here unanswered, whose answer may still come from there (late_elsewhere)."""
        now = self.clock()
        for command_id in [
            i for i, r in self.late_elsewhere.items() if now > r.deadline + LATE_WATCH_SECONDS
        ]:
            del self.late_elsewhere[command_id]  # no answer within the hour: none is awaited any more
        waiting = [r for r in self.open.values() if r.node not in self.streams]
        return waiting + list(self.late_elsewhere.values())

    def settle(self, stored: CommandRecord) -> None:
        """A delegated command's row as its node's replica last wrote it: its state taken up here; a
        finished one finishes here too (listeners told), without writing the row again. One timed
        out here that the replica stored an answer for gets that answer, noted as late."""
        late = self.late_elsewhere.get(stored.id)
        if late is not None:
            if stored.state in ("succeeded", "failed"):
                del self.late_elsewhere[stored.id]
                self._late_outcome(late, stored.state, stored.error, stored.result)
            return
        record = self.open.get(stored.id)
        if record is None or record.node in self.streams:  # its node streams here now: answered here
            return
        if stored.finished is None:
            record.state, record.sent, record.boot_id = stored.state, stored.sent, stored.boot_id
            return
        failure = {"succeeded": "", "timed_out": "timeout", "cancelled": "cancelled"}.get(
            stored.state, "error"
        )
        if stored.error == RESTARTED:
            failure = "restarted"
        self._finish(
            record, stored.state, error=stored.error, result=stored.result, failure=failure, persist=False
        )

    def take_up(self, stored: CommandRecord) -> bool:
        """A command another replica issued for a node that streams here: sent on its stream, same
        id (the agent runs an id once), its states stored from here. False: not taken up (known
        here already, or the node does not stream here)."""
        stream = self.streams.get(stored.node)
        if (
            stream is None
            or stored.id in self.open
            or stored.id in self._finished
            or stored.id in self._issuing
        ):
            return False
        self.open[stored.id] = stored
        self.taken_up.add(stored.id)
        self._send(stored, stream, again=stored.state != "pending")
        return True

    def let_go(self, still_open: set[str]) -> list[str]:
        """Let go of the taken-up commands no longer open in the store (their issuer finished them:
        timed out, cancelled); their ids. Each is kept as timed out, unanswered, so that the agent's
        answer, if it comes, is still stored as the real outcome (late) for the issuer to take up."""
        gone = [i for i in self.taken_up if i not in still_open and i in self.open]
        for command_id in gone:
            record = self.open.pop(command_id)
            record.state, record.finished, record.error = "timed_out", self.clock(), _late(record)
            self._keep_finished(record)
        self.taken_up &= set(self.open)
        return gone

    # Issuing

    async def issue(
        self, node: str, command: pb.Command, requester: str, *, timeout_seconds: float | None = None
    ) -> CommandRecord:
        """Store the command, then put it on the node's stream. FailedPrecondition: the node is not
        connected, or (for a mutating command) one holds the node; InvalidMessage: an unknown kind
        or a used id. Until its row is committed the command is nobody's to send; the node's
        mutating slot and the id are reserved meanwhile."""
        kind = self.kinds.get(kind_of(command))
        if kind is None:
            raise InvalidMessage(f"unknown command kind {kind_of(command)!r}")
        if not self.reachable(node):
            raise FailedPrecondition(f"node {node} is not connected")
        if kind.mutating:
            busy = self.mutating_holder(node)
            if busy is not None:
                unknown = busy.state == "timed_out"
                held = "; timed out, its outcome unknown until the agent answers" if unknown else ""
                raise FailedPrecondition(
                    f"node {node} already has a mutating command in flight: {busy.id} "
                    f"({busy.kind}, {busy.state}, requested by {busy.requester}{held})"
                )
        command = _copy(command)
        command.id = command.id or uuid.uuid4().hex
        if command.id in self.open or command.id in self._finished or command.id in self._issuing:
            raise InvalidMessage(f"command id {command.id} is already used")
        now = self.clock()
        timeout = kind.timeout_seconds if timeout_seconds is None else timeout_seconds
        record = CommandRecord(command.id, node, kind.name, requester, now, now + timeout, command)
        _set_deadline(record, now)
        self._issuing[record.id] = record  # reserves the id and (mutating) the node during the write
        try:
            await self.store.save_command(record)  # stored before sent: no restart loses or repeats it
        finally:
            self._issuing.pop(record.id, None)
        self.open[record.id] = record
        stream = self.streams.get(node)
        if stream is not None:
            self._send(record, stream)
        return record

    def _send(self, record: CommandRecord, stream: NodeStream, *, again: bool = False) -> None:
        if record.open and not (record.state == "running" and record.boot_id == stream.boot_id):
            record.state = "sent"  # (a run the same agent boot has begun stays running)
        record.sent, record.boot_id = self.clock(), stream.boot_id
        _set_deadline(record, record.sent)
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
        """The node's CommandResult. A command that timed out unanswered gets its real outcome
        (noted as late) and frees its node; None when it answers nothing of this node's (a repeat)."""
        record = self.open.get(result.command_id)
        if record is None:
            late = self._finished.get(result.command_id) or self.held.get(node)
            if (
                late is not None
                and (late.id, late.node, late.state) == (result.command_id, node, "timed_out")
                and late.result is None
            ):
                return self._late_answer(late, result)
            log.info("node %s: answer to command %s, which is not in flight", node, result.command_id)
            return None
        if record.node != node:
            log.info("node %s: answer to command %s, which is not in flight", node, result.command_id)
            return None
        state = "succeeded" if result.ok else "failed"
        self._finish(record, state, error=result.error, result=result, failure="" if result.ok else "error")
        return record

    def _late_answer(self, record: CommandRecord, result: pb.CommandResult) -> CommandRecord:
        return self._late_outcome(record, "succeeded" if result.ok else "failed", result.error, result)

    def _late_outcome(
        self, record: CommandRecord, state: str, error: str, result: pb.CommandResult | None
    ) -> CommandRecord:
        note = f"answered after its deadline ({record.error})"
        if error.startswith("answered after its deadline"):  # noted so by the replica that sent it
            note, error = error, ""
        record.state = state
        record.error = f"{note}: {error}" if error else note
        record.result = result
        if self.held.get(record.node) is record:
            del self.held[record.node]
        self._persist(record)
        log.warning(
            "node %s: command %s (%s) %s, %s", record.node, record.id, record.kind, record.state, note
        )
        return record

    def expire(self, now: float | None = None) -> list[CommandRecord]:
        """Time out the commands past their deadline."""
        now = self.clock() if now is None else now
        late = [r for r in self.open.values() if now >= r.deadline]
        for record in late:
            self._time_out(record)
        return late

    def _time_out(self, record: CommandRecord) -> None:
        was_sent = record.state != "pending"
        elsewhere = record.node not in self.streams and self.elsewhere is not None
        # Another replica sends it: its answer may be stored already, which timed_out must not hide.
        self._finish(record, "timed_out", error=_late(record), failure="timeout", persist=not elsewhere)
        if elsewhere:
            self.store.save_command(record, if_open=True).add_done_callback(_log_failure)
            self.late_elsewhere[record.id] = record
            while len(self.late_elsewhere) > KEEP_FINISHED:
                self.late_elsewhere.popitem(last=False)
        if was_sent and self._mutating(record):  # the agent may be applying it still
            self.held[record.node] = record

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
        persist: bool = True,
    ) -> None:
        record.state, record.finished, record.error, record.failure = state, self.clock(), error, failure
        if result is not None:
            record.result = result
        del self.open[record.id]
        self._keep_finished(record)
        self.taken_up.discard(record.id)
        if persist:
            self._persist(record)
        if state == "succeeded":
            log.info("node %s: command %s (%s) succeeded", record.node, record.id, record.kind)
        else:
            brief = _brief(error)
            log.warning("node %s: command %s (%s) %s: %s", record.node, record.id, record.kind, state, brief)
            if brief != error:
                log.debug("node %s: command %s error in full: %s", record.node, record.id, error)
        for listener in self.listeners:
            listener(record)
        done = self._done.pop(record.id, None)
        if done is not None:
            done.set()

    def _keep_finished(self, record: CommandRecord) -> None:
        self._finished[record.id] = record
        while len(self._finished) > KEEP_FINISHED:
            self._finished.popitem(last=False)

    def _persist(self, record: CommandRecord) -> None:
        self.store.save_command(record).add_done_callback(_log_failure)

    # Queries

    def _mutating(self, record: CommandRecord) -> bool:
        kind = self.kinds.get(record.kind)
        return kind is None or kind.mutating  # a kind this controller does not know: assume it mutates

    def in_flight(self, node: str) -> list[CommandRecord]:
        return self.open.of_node(node)

    def mutating_holder(self, node: str) -> CommandRecord | None:
        """The mutating command holding the node: being stored, in flight, or timed out unanswered."""
        for record in (*self._issuing.values(), *self.open.of_node(node)):
            if record.node == node and self._mutating(record):
                return record
        return self.held.get(node)

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


def _brief(error: str) -> str:
    """`error` on one line of at most LOG_ERROR_CHARS and a count: a refused probe run's error names
    every GPU, probe and variant (kilobytes); the log shows its start, DEBUG the whole."""
    line = " ".join(error.split())
    if len(line) <= LOG_ERROR_CHARS:
        return line
    return f"{line[:LOG_ERROR_CHARS]}... ({len(line)} characters; in full at DEBUG)"


def _late(record: CommandRecord) -> str:
    return f"no answer within {record.deadline - record.created:.0f}s"


def _set_deadline(record: CommandRecord, now: float) -> None:
    """What is left of the deadline as the command goes out: relative, so skew does not matter."""
    record.command.seconds_left = max(0.0, record.deadline - now)


def _copy(command: pb.Command) -> pb.Command:
    out = pb.Command()
    out.CopyFrom(command)
    return out


def _log_failure(future: asyncio.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("command state not stored: %s", future.exception())
