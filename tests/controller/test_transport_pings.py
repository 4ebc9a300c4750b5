"""No HTTP/2 PING per frame between an agent and the controller (controller/listeners.py NO_BDP_PROBE).

gRPC core probes the bandwidth-delay product with a PING when data arrives; with one frame per stream
every 10 s nearly every frame drew one, a fifth of the transport's CPU per frame. A proxy between
the two reads the HTTP/2 frames that pass (cleartext) and counts the PINGs each side starts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from agent.stream.client import CHANNEL_OPTIONS
from controller.listeners import NO_BDP_PROBE
from controller.servicer import EOF
from protos.gpufleet.v1 import telemetry_pb2 as pb
from protos.gpufleet.v1 import telemetry_pb2_grpc
from tests.controller.harness import T0, config, frame, hello, running_controller

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
PING, ACK = 0x6, 0x1
FRAMES = 12
GAP_SECONDS = 0.05
Options = Sequence[tuple[str, Any]]


class PingCounter:
    """A TCP proxy on 127.0.0.1 that counts the PINGs (not their answers) each side sends."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.started: Counter[str] = Counter()  # "agent" / "controller" -> PINGs started
        self.server: asyncio.Server | None = None
        self.address = ""
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> PingCounter:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        host, port = self.upstream.rsplit(":", 1)
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        with contextlib.suppress(asyncio.CancelledError):  # the proxy stopped: connections end here
            await asyncio.gather(
                self._pipe(reader, up_writer, "agent", PREFACE),
                self._pipe(up_reader, writer, "controller", b""),
            )
        writer.close()
        up_writer.close()

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, side: str, preface: bytes
    ) -> None:
        try:
            if preface:
                writer.write(await reader.readexactly(len(preface)))
            while True:
                header = await reader.readexactly(9)
                length = int.from_bytes(header[:3], "big")
                if header[3] == PING and not header[4] & ACK:
                    self.started[side] += 1
                writer.write(header + await reader.readexactly(length))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def _frames_one_by_one(proxy: PingCounter, options: Options) -> Counter[str]:
    """An agent's stream through the proxy: Hello, then FRAMES frames, each sent once the one before
    it is acked; the PINGs started meanwhile (not those of closing: gRPC's GOAWAY sends one)."""
    outbox: asyncio.Queue[pb.AgentMessage | None] = asyncio.Queue()

    async def messages() -> AsyncIterator[pb.AgentMessage]:
        while (message := await outbox.get()) is not None:
            yield message

    async with grpc.aio.insecure_channel(proxy.address, options=options) as channel:
        call = telemetry_pb2_grpc.TelemetryStub(channel).Stream(messages())
        await outbox.put(pb.AgentMessage(hello=hello("n1")))
        for seq in range(1, FRAMES + 1):
            await outbox.put(pb.AgentMessage(frame=frame(seq, "n1", t=T0 - 2 * FRAMES)))
            while True:
                reply = await asyncio.wait_for(call.read(), 10)
                assert reply != EOF, "the stream ended before every frame was acked"
                assert isinstance(reply, pb.ControllerMessage)
                if reply.WhichOneof("msg") == "ack" and reply.ack.seq == seq:
                    break
            await asyncio.sleep(GAP_SECONDS)
        started = Counter(proxy.started)
        await outbox.put(None)
        call.cancel()
    return started


class AckEveryFrame(telemetry_pb2_grpc.TelemetryServicer):
    async def Stream(self, request_iterator: Any, context: Any) -> AsyncIterator[pb.ControllerMessage]:
        async for message in request_iterator:
            if message.WhichOneof("msg") == "frame":
                yield pb.ControllerMessage(ack=pb.Ack(boot_id=message.frame.boot_id, seq=message.frame.seq))


async def _pings_with_a_bare_server(server_options: Options, channel_options: Options) -> Counter[str]:
    server = grpc.aio.server(options=server_options)
    telemetry_pb2_grpc.add_TelemetryServicer_to_server(AckEveryFrame(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with PingCounter(f"127.0.0.1:{port}") as proxy:
            return await _frames_one_by_one(proxy, channel_options)
    finally:
        await server.stop(None)


def test_grpc_probes_with_a_ping_per_frame_unless_each_side_says_not_to() -> None:
    """The control: with gRPC's defaults both sides start PINGs as frames and acks arrive (were
    this to stop, NO_BDP_PROBE would no longer be needed); each side's option stops its own."""
    defaults = asyncio.run(_pings_with_a_bare_server([], []))
    assert defaults["controller"] >= 2 and defaults["agent"] >= 1, defaults
    server_off = asyncio.run(_pings_with_a_bare_server([NO_BDP_PROBE], []))
    assert server_off["controller"] == 0 and server_off["agent"] >= 1, server_off
    both_off = asyncio.run(_pings_with_a_bare_server([NO_BDP_PROBE], [NO_BDP_PROBE]))
    assert both_off == Counter(), both_off


def test_an_agent_and_the_controller_exchange_frames_without_pings() -> None:
    """The controller's server as built (controller/server.py) and the agent's channel options:
    twelve frames acked, and neither side starts a PING (keepalive's come every 30 s)."""

    async def go() -> Counter[str]:
        async with running_controller(config()) as running, PingCounter(running.address) as proxy:
            started = await _frames_one_by_one(proxy, CHANNEL_OPTIONS)
            assert "n1" in running.app.fleet.nodes  # its frames were taken in, not only acked
            return started

    assert asyncio.run(go()) == Counter()
