"""An ingest front (`python -m controller.fronts.front`, started by the controller with
`ingest_fronts: N`): a gRPC server on the agents' port, shared with the other fronts by
SO_REUSEPORT (the kernel spreads connections over them), that relays each agent stream to the
controller over its stdin and stdout (wire.py) and the controller's answers back. The controller
checks, stores, acks and sends commands as for a stream of its own (controller/fronts/relay.py).
What it saves the controller is gRPC's own work (HTTP/2, TLS, the asyncio server's per-message
machinery) and, for the frames it can (planner.py), parsing, checking and planning them: all done
here, on other cores.

Its stdin closed (the controller gone), it stops: its agents reconnect to the next controller.
Operators' RPCs are not served here: they are answered FAILED_PRECONDITION, naming operator_listen.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from typing import Any

import grpc

from controller import event_loop
from controller.batched_writes import BatchedWriter
from controller.children import ignore_stop_signals
from controller.fronts import wire
from controller.fronts.planner import StreamPlanner
from controller.security.tls import ServerTls
from protos.logsafe import configure_logging

log = logging.getLogger("gpufleet.controller.front")
STREAM_METHOD = "/gpufleet.v1.Telemetry/Stream"
EOF: object = grpc.aio.EOF  # type: ignore[attr-defined] # what context.read returns at the end; not in grpc-stubs
OPERATORS_ELSEWHERE = (
    "this port is served by the controller's ingest fronts, for agents only: operators connect to "
    "the controller's operator_listen address"
)


class _Stream:
    """One agent stream: the controller's answers, and how its messages go."""

    def __init__(self) -> None:
        self.answers: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()
        self.relayed = 0  # the agent's messages sent on (its Hello first)
        self.planner: StreamPlanner | None = None


class Front:
    def __init__(self) -> None:
        self.streams: dict[int, _Stream] = {}
        self.settings: wire.FrontSettings | None = None
        self.ready = asyncio.Event()
        self.done = asyncio.Event()  # the controller's side closed
        self._next = 0
        self._out: BatchedWriter | None = None
        self._writable = asyncio.Event()
        self._writable.set()

    # The controller's side

    def on_record(self, kind: int, stream: int, payload: bytes) -> None:
        if kind == wire.INIT:
            self.settings = wire.unpickled(payload)
            self.ready.set()
            return
        entry = self.streams.get(stream)
        if entry is not None:  # else a stream already gone: what the controller sent goes with it
            entry.answers.put_nowait((kind, payload))

    def send(self, data: bytes) -> None:
        if self._out is not None and not self._out.is_closing():
            self._out.write(data)

    # One agent stream

    async def relay(self, requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        """One agent stream, on gRPC's reader/writer API (`requests`, its iterator, left unused):
        the agent's messages read by a pump of their own, the controller's answers written here.
        Neither holds a message while it waits for the next."""
        self._next += 1
        sid = self._next
        stream = self.streams[sid] = _Stream()
        auth = {key: list(values) for key, values in (context.auth_context() or {}).items()}
        self.send(wire.pickled(wire.OPEN, sid, (context.peer(), auth)))
        ended = [False]  # END sent: the controller knows this stream is over
        pump = asyncio.create_task(self._pump(context, sid, stream, ended))
        try:
            while True:
                kind, payload = await stream.answers.get()
                if kind == wire.SEND:
                    await context.write(payload)
                elif kind == wire.ACCEPT:
                    # Frames are planned from the node's state as the controller sent it, which only
                    # holds if nothing but the Hello went before (agents wait for this answer).
                    if payload and stream.relayed == 1:
                        stream.planner = StreamPlanner(wire.unpickled(payload))
                    await context.send_initial_metadata(())
                elif kind == wire.CLOSE:
                    ended[0] = True  # the controller ended it: nothing to tell it
                    code, details, metadata = wire.unpickled(payload)
                    if code == wire.OK:
                        return
                    await context.abort(wire.status_code(code), details, trailing_metadata=metadata)
                del payload
        finally:
            pump.cancel()
            del self.streams[sid]
            if not ended[0]:  # cancelled here (the agent's connection gone, or this front stopping)
                self.send(wire.record(wire.END, sid, b"cancelled"))

    async def _pump(
        self, context: grpc.aio.ServicerContext[Any, Any], sid: int, stream: _Stream, ended: list[bool]
    ) -> None:
        why = b""
        try:
            while (raw := await context.read()) is not EOF:
                stream.relayed += 1
                planned = None if stream.planner is None else stream.planner.plan(raw)
                if planned is None:
                    self.send(wire.record(wire.MSG, sid, raw))
                else:
                    self.send(wire.record(wire.PLANNED, sid, planned))
                del raw, planned
                if not self._writable.is_set():  # the controller is behind: stop reading this agent
                    await self._writable.wait()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the stream broke: the controller is told why
            why = f"{type(exc).__name__}: {exc}".encode()
        if not ended[0]:
            ended[0] = True
            self.send(wire.record(wire.END, sid, why))

    # The pipe's flow control (a protocol's pause_writing / resume_writing)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()


class _Input(asyncio.Protocol):
    def __init__(self, front: Front) -> None:
        self.records = wire.Records(front.on_record)
        self.front = front

    def data_received(self, data: bytes) -> None:
        self.records.feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.front.done.set()


class _Output(asyncio.Protocol):
    def __init__(self, front: Front) -> None:
        self.front = front

    def pause_writing(self) -> None:
        self.front.pause_writing()

    def resume_writing(self) -> None:
        self.front.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.front.done.set()


def _refuse_operators(operators: str) -> grpc.RpcMethodHandler[Any, Any]:
    why = f"{OPERATORS_ELSEWHERE}, {operators}" if operators else OPERATORS_ELSEWHERE

    async def refuse(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, why)

    return grpc.unary_unary_rpc_method_handler(refuse)


class _Handler(grpc.GenericRpcHandler):  # type: ignore[type-arg] # generic only in the stubs
    def __init__(self, front: Front) -> None:
        self.front = front

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = details.method
        if method == STREAM_METHOD:
            return grpc.stream_stream_rpc_method_handler(self.front.relay)  # bytes both ways
        if method.startswith("/gpufleet.v1.Operator/"):
            return _refuse_operators(self.front.settings.operators if self.front.settings else "")
        return None


async def serve() -> None:
    front = Front()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: _Input(front), sys.stdin.buffer)
    written, _ = await loop.connect_write_pipe(lambda: _Output(front), sys.stdout.buffer)
    out = event_loop.write_transport(written)
    front._out = BatchedWriter(out)
    ready = asyncio.create_task(front.ready.wait())
    ended = asyncio.create_task(front.done.wait())
    await asyncio.wait([ready, ended], return_when=asyncio.FIRST_COMPLETED)
    ended.cancel()
    if front.settings is None or front.done.is_set() or out.is_closing():
        return  # the controller went (its pipes with it) as it started this front: nothing to serve
    settings = front.settings
    out.set_write_buffer_limits(high=settings.high_water)
    server = grpc.aio.server(options=[*settings.options, ("grpc.so_reuseport", 1)])
    server.add_generic_rpc_handlers((_Handler(front),))
    try:
        if settings.tls is None:
            port = server.add_insecure_port(settings.listen)
        else:
            credentials = ServerTls(settings.tls).credentials(client_certificates=True)
            port = server.add_secure_port(settings.listen, credentials)
    except RuntimeError as exc:
        port, why = 0, str(exc)
    else:
        why = "the port is taken by a process that does not share it (SO_REUSEPORT)"
    if port == 0:
        log.error("ingest front: cannot listen on %s: %s", settings.listen, why)
        raise SystemExit(1)
    await server.start()
    front.send(wire.record(wire.READY, 0, str(port).encode()))
    log.info("ingest front %d serving agents on port %d", os.getpid(), port)
    await front.done.wait()
    await server.stop(None)


def main() -> None:
    ignore_stop_signals()  # the controller ends this process: its stdin's end
    configure_logging("info")  # to stderr: the controller's own log
    with contextlib.suppress(KeyboardInterrupt):
        event_loop.run(serve(), os.environ.get(event_loop.ENV, "auto"))  # the controller's loop


if __name__ == "__main__":
    main()
