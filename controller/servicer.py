"""Telemetry service: one bidirectional stream per agent, translated to ingest calls.

On gRPC's reader/writer API (context.read, context.write), not its iterators: the stream's reader
task reads each frame, ingests it and writes its ack itself; the handler writes everything else the
controller sends on the stream (the Hello's ack position first, then commands: on connect, from the
probe scheduler, or from operators through app.commands), queued in the stream's outbox. Writes go
one at a time (StreamWrites), as gRPC allows. Per frame that is the reader's turn alone: with the
iterators, each frame also passed two async generators in and, as its ack, a queue and three
generators out, with a task of its own to shield its ingest
(bench/results/2026-12-02_stream_reader_writer.txt).
An ingest front's relay (fronts/relay.py) serves its streams through a context that reads and
writes the same way.

One command stream per node, the newest: when a second stream says Hello with a node name that
already has one, the new stream wins and the old one is closed with ABORTED ("replaced by a newer
stream for node X from PEER"); the node's unfinished commands are sent again, same ids, on the new
one. Two agents configured with the same node name therefore keep replacing each other, and the
controller logs each replacement: give every agent its own name.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import grpc
from google.protobuf.message import DecodeError

from controller.app import ControllerApp
from controller.commands.channel import WAKE
from controller.errors import InvalidMessage
from controller.frame_bytes import frame_bytes
from controller.ingest import PlannedFrame
from controller.security.identity import IdentityRefused, check_node
from protos.gpufleet.v1 import telemetry_pb2 as pb
from protos.gpufleet.v1 import telemetry_pb2_grpc

log = logging.getLogger("gpufleet.controller.stream")
SERVICE = "gpufleet.v1.Telemetry"
EOF: object = grpc.aio.EOF  # type: ignore[attr-defined] # what context.read returns at the end; not in grpc-stubs


class Received(NamedTuple):
    """An agent's message as gRPC parsed it, with the bytes it came as: a frame's own bytes then go
    to the detection process as received (when screening cleared nothing), not serialized again."""

    message: pb.AgentMessage
    raw: bytes


def received(data: bytes) -> Received:
    """The request deserializer of the agents' stream (add_telemetry)."""
    return Received(pb.AgentMessage.FromString(data), data)


# What a stream's context.read gives: gRPC's, a Received; a front's relay, its planned frames ready
# parsed (fronts/relay.py) and other messages as AgentMessages.
AgentMessage = pb.AgentMessage | PlannedFrame | Received


@dataclass(slots=True, eq=False)
class StreamWrites:
    """A stream's writes, one at a time (gRPC allows one outstanding write). Once `closed` (the
    handler ended) or `replaced` (a newer stream of the node), nothing more is written."""

    context: Any  # grpc.aio.ServicerContext, or a front's RelayContext
    replaced: asyncio.Event
    closed: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def send(self, message: pb.ControllerMessage) -> None:
        async with self.lock:
            if not self.closed and not self.replaced.is_set():
                await self.context.write(message)


@dataclass(slots=True, eq=False)
class Reading:
    """Whether the stream's reader is ingesting a frame: a stream that ends then lets it finish the
    frame (then it writes nothing and stops) instead of cancelling it, since a frame cancelled between
    the store's write and memory's update would leave the next Hello acking a frame memory never saw."""

    ingesting: bool = False


class TelemetryServicer(telemetry_pb2_grpc.TelemetryServicer):
    """agents=False on the operators' port (server TLS, no client certificates): no streams there."""

    def __init__(self, app: ControllerApp, *, agents: bool = True) -> None:
        self.app = app
        self.agents = agents

    async def Stream(self, request_iterator: Any, context: Any) -> None:  # type: ignore[override]
        """The stream, read and written through `context` (gRPC's iterator, `request_iterator`, is
        left unused)."""
        if not self.agents:
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "agents must connect to the agent port with a client certificate",
            )
        first = _unwrapped(await next_message(context))
        if first is None:
            return
        if not isinstance(first, pb.AgentMessage) or first.WhichOneof("msg") != "hello":
            raise InvalidMessage("the first message on a stream must be a Hello")
        hello = first.hello
        # On TLS the node is the certificate's (a DNS SAN), never only what the Hello says.
        try:
            transport = check_node(context.auth_context(), hello.node)
        except IdentityRefused as exc:
            self.app.identity.refused(exc.reason)
            log.warning("refused a stream from %s: %s", context.peer(), exc)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        acked = await self.app.ingest.hello(hello)
        self.app.identity.accepted(hello.node, transport)
        # Accepted: the agent starts sending frames once it sees this (agent/stream/client.py).
        await context.send_initial_metadata(())
        self.app.connection_log.connected(hello.node, hello.boot_id, context.peer(), acked)
        await self._serve(context, hello, acked)

    async def _serve(self, context: Any, hello: pb.Hello, acked: int) -> None:
        """The accepted stream of `hello`'s node, whose boot's ack position is `acked`."""
        outbox: asyncio.Queue[pb.ControllerMessage] = asyncio.Queue()
        self.app.connected(hello.node)
        # Commands for the node go to this stream now; an older stream of the node is told to close.
        # Replacing it puts a wake-up in its outbox (the channel), as its reader's end does below,
        # so the loop below awaits the outbox alone.
        stream = self.app.commands.open_stream(hello, outbox, context.peer())
        if stream.replaces:  # the old one's connection may be half-open: a partition that healed
            self.app.connection_log.replaced(hello.node, stream.replaces, stream.peer)
        writes, reading = StreamWrites(context, stream.replaced), Reading()
        reader: asyncio.Task[None] | None = None
        try:
            if acked:  # the Hello's ack position, before any frame's ack or command
                await writes.send(pb.ControllerMessage(ack=pb.Ack(boot_id=hello.boot_id, seq=acked)))
            reader = asyncio.create_task(
                self._read(context, hello.node, writes, reading), name=f"stream {hello.node} reader"
            )
            reader.add_done_callback(lambda _: outbox.put_nowait(WAKE))
            await self.app.probe_on_connect(hello)
            while True:
                message = await outbox.get()
                # Replaced first, even with a message waiting: a replaced stream sends nothing more
                # (its commands went again, same ids, on the newer stream).
                if stream.replaced.is_set():  # (the channel logged it) unsent messages go with it
                    await context.abort(grpc.StatusCode.ABORTED, stream.replaced_by)
                if message is not WAKE:
                    await writes.send(message)
                    continue
                if not reader.done():
                    continue
                while not outbox.empty():  # what was queued before the reader ended
                    message = outbox.get_nowait()
                    if message is not WAKE:
                        await writes.send(message)
                reader.result()  # raises the error that ended the stream, if any
                return
        finally:
            writes.closed = True
            if reader is not None:
                _stop(reader, reading)
            self.app.commands.close_stream(stream)
            self.app.disconnected(hello.node)
            self.app.connection_log.disconnected(hello.node)

    async def _read(self, context: Any, node: str, writes: StreamWrites, reading: Reading) -> None:
        """The stream's messages after its Hello, until the agent half-closes it: each frame ingested,
        then acked (unless the stream ended meanwhile). Nothing of a message stays referenced while the
        next is awaited (ten seconds for an agent's frames): its bytes and their parse, held by every
        stream, were tens of kilobytes a node."""
        while (item := await next_message(context)) is not None:
            if not await self._take(item, node, writes, reading):
                return
            del item

    async def _take(self, item: AgentMessage, node: str, writes: StreamWrites, reading: Reading) -> bool:
        """One message of the stream handled; False when the stream ended meanwhile (its reader stops)."""
        raw: bytes | None
        if isinstance(item, PlannedFrame):
            frame, plan, raw = item.frame, item.plan, item.raw
        else:
            msg, received_as = item if isinstance(item, Received) else (item, None)
            kind = msg.WhichOneof("msg")
            if kind == "command_result":
                self.app.commands.answered(node, msg.command_result)
                return True
            if kind == "command_started":
                self.app.commands.started(node, msg.command_started.command_id)
                return True
            if kind == "hello":
                raise InvalidMessage("Hello is allowed only as the first message of a stream")
            if kind != "frame":
                raise InvalidMessage("empty or unknown agent message")
            frame, plan = msg.frame, None
            raw = None if received_as is None else frame_bytes(received_as)
        reading.ingesting = True
        try:
            seq = await self.app.ingest.frame(node, frame, plan, raw)
        finally:
            reading.ingesting = False
        if writes.closed:
            return False
        await writes.send(pb.ControllerMessage(ack=pb.Ack(boot_id=frame.boot_id, seq=seq)))
        self.app.probing.frame_results(node, frame)  # stored first: a waiter sees them stored
        return True


async def next_message(context: Any) -> AgentMessage | None:
    """The stream's next message; None once the agent half-closed it. Bytes that do not parse are the
    client's error (INVALID_ARGUMENT), not an internal one."""
    try:
        item = await context.read()
    except DecodeError as exc:
        raise InvalidMessage(f"malformed AgentMessage: {exc}") from None
    return None if item is EOF else item


def _unwrapped(item: AgentMessage | None) -> pb.AgentMessage | PlannedFrame | None:
    return item.message if isinstance(item, Received) else item


def _stop(reader: asyncio.Task[None], reading: Reading) -> None:
    """The stream ended: its reader cancelled, unless it is ingesting a frame (Reading)."""
    if reader.done():
        return
    if reading.ingesting:
        reader.add_done_callback(_settled)
    else:
        reader.cancel()


def _settled(reader: asyncio.Task[None]) -> None:
    """A frame's ingest finished after its stream ended: an error it raised has no stream left to end
    (the agent sends the frame again)."""
    if not reader.cancelled() and reader.exception() is not None:
        log.info("a frame ingested after its stream ended failed: %s", reader.exception())


def add_telemetry(servicer: TelemetryServicer, server: grpc.aio.Server) -> None:
    """Serve `servicer` on `server` as telemetry_pb2_grpc.add_TelemetryServicer_to_server does, but
    each message comes with its bytes as received (Received)."""
    handlers = {
        "Stream": grpc.stream_stream_rpc_method_handler(
            servicer.Stream,
            request_deserializer=received,
            response_serializer=pb.ControllerMessage.SerializeToString,
        )
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    # As the generated code does (gRPC matches the method in its core); not in grpc's stubs.
    server.add_registered_method_handlers(SERVICE, handlers)  # type: ignore[attr-defined]
