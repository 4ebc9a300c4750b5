"""Telemetry service: one bidirectional stream per agent, translated to ingest calls.

The response side is a queue, so acks and commands (on connect, from the probe scheduler or from
operators, issued through app.commands) interleave freely with reading.

One command stream per node, the newest: when a second stream says Hello with a node name that
already has one, the new stream wins and the old one is closed with ABORTED ("replaced by a newer
stream for node X from PEER"); the node's unfinished commands are sent again, same ids, on the new
one. Two agents configured with the same node name therefore keep replacing each other, and the
controller logs each replacement: give every agent its own name.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

import grpc
from google.protobuf.message import DecodeError

from controller.app import ControllerApp
from controller.errors import InvalidMessage
from controller.frame_bytes import frame_bytes
from controller.ingest import PlannedFrame
from controller.security.identity import IdentityRefused, check_node
from protos.gpufleet.v1 import telemetry_pb2 as pb
from protos.gpufleet.v1 import telemetry_pb2_grpc

log = logging.getLogger("gpufleet.controller.stream")
_WAKE = pb.ControllerMessage()  # in an outbox: the stream's reader ended or it was replaced (never sent)
SERVICE = "gpufleet.v1.Telemetry"


class Received(NamedTuple):
    """An agent's message as gRPC parsed it, with the bytes it came as: a frame's own bytes then go
    to the detection process as received (when screening cleared nothing), not serialized again."""

    message: pb.AgentMessage
    raw: bytes


def received(data: bytes) -> Received:
    """The request deserializer of the agents' stream (add_telemetry)."""
    return Received(pb.AgentMessage.FromString(data), data)


# A front's planned frames come ready parsed (fronts/relay.py); tests feed AgentMessages alone.
AgentMessage = pb.AgentMessage | PlannedFrame | Received


class TelemetryServicer(telemetry_pb2_grpc.TelemetryServicer):
    """agents=False on the operators' port (server TLS, no client certificates): no streams there."""

    def __init__(self, app: ControllerApp, *, agents: bool = True) -> None:
        self.app = app
        self.agents = agents

    async def Stream(
        self, request_iterator: AsyncIterator[AgentMessage], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.ControllerMessage]:
        if not self.agents:
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "agents must connect to the agent port with a client certificate",
            )
        request_iterator = _decoded(request_iterator)
        first = _unwrapped(await anext(aiter(request_iterator), None))
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
        outbox: asyncio.Queue[pb.ControllerMessage] = asyncio.Queue()
        if acked:
            outbox.put_nowait(pb.ControllerMessage(ack=pb.Ack(boot_id=hello.boot_id, seq=acked)))
        self.app.connected(hello.node)
        # Commands for the node go to this stream now; an older stream of the node is told to close.
        stream = self.app.commands.open_stream(hello, outbox, context.peer())
        reader = asyncio.create_task(self._read(request_iterator, hello.node, outbox))
        replaced = asyncio.create_task(stream.replaced.wait())
        # Either ending puts a wake-up in the outbox, so the loop below awaits the outbox alone (no
        # task per message sent: a fleet's acks are most of the controller's messages).
        for task in (reader, replaced):
            task.add_done_callback(lambda _: outbox.put_nowait(_WAKE))
        try:
            await self.app.probe_on_connect(hello)
            while True:
                message = await outbox.get()
                # Replaced first, even with a message waiting: a replaced stream sends nothing more
                # (its commands went again, same ids, on the newer stream).
                if stream.replaced.is_set():  # (the channel logged it) unsent messages go with it
                    await context.abort(grpc.StatusCode.ABORTED, stream.replaced_by)
                if message is not _WAKE:
                    yield message
                    continue
                if not reader.done():
                    continue
                while not outbox.empty():  # what was queued before the reader ended
                    message = outbox.get_nowait()
                    if message is not _WAKE:
                        yield message
                reader.result()  # raises the error that ended the stream, if any
                return
        finally:
            reader.cancel()
            replaced.cancel()
            self.app.commands.close_stream(stream)
            self.app.disconnected(hello.node)
            self.app.connection_log.disconnected(hello.node)

    async def _read(
        self, requests: AsyncIterator[AgentMessage], node: str, outbox: asyncio.Queue[pb.ControllerMessage]
    ) -> None:
        async for item in requests:
            if isinstance(item, PlannedFrame):
                await self._frame(node, item.frame, outbox, item)
                continue
            msg, raw = item if isinstance(item, Received) else (item, None)
            kind = msg.WhichOneof("msg")
            if kind == "frame":
                await self._frame(node, msg.frame, outbox, raw=None if raw is None else frame_bytes(raw))
            elif kind == "command_result":
                self.app.commands.answered(node, msg.command_result)
            elif kind == "command_started":
                self.app.commands.started(node, msg.command_started.command_id)
            elif kind == "hello":
                raise InvalidMessage("Hello is allowed only as the first message of a stream")
            else:
                raise InvalidMessage("empty or unknown agent message")

    async def _frame(
        self,
        node: str,
        frame: pb.TelemetryFrame,
        outbox: asyncio.Queue[pb.ControllerMessage],
        planned: PlannedFrame | None = None,
        *,
        raw: bytes | None = None,
    ) -> None:
        """`raw`: the frame's own bytes as received (None: not at hand)."""
        ingest = self.app.ingest
        work = (
            ingest.frame(node, frame, None, raw)
            if planned is None
            else ingest.frame(node, frame, planned.plan, planned.raw)
        )
        # Shielded: a stream that ends mid-ingest (the agent reconnecting) must not cancel it between
        # the store's write and memory's update (the next Hello would then ack a frame memory never saw).
        seq = await asyncio.shield(work)
        outbox.put_nowait(pb.ControllerMessage(ack=pb.Ack(boot_id=frame.boot_id, seq=seq)))
        self.app.probing.frame_results(node, frame)  # stored first: a waiter sees them stored


def _unwrapped(item: AgentMessage | None) -> pb.AgentMessage | PlannedFrame | None:
    return item.message if isinstance(item, Received) else item


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


async def _decoded(requests: AsyncIterator[AgentMessage]) -> AsyncIterator[AgentMessage]:
    """The stream's messages; bytes that do not parse are the client's error (INVALID_ARGUMENT),
    not an internal one."""
    try:
        async for msg in requests:
            yield msg
    except DecodeError as exc:
        raise InvalidMessage(f"malformed AgentMessage: {exc}") from None
