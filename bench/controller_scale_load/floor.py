"""The transport's floor: a bare Telemetry server that takes each stream's Hello, then acks every frame
and does nothing else (no checks, no store, no fleet state, no detection), on gRPC's asyncio server
as the controller runs it. Under the same load, its CPU per frame is what receiving a frame and
sending its ack costs in this process model before the controller does any work: the part of the
controller's CPU per frame that no change to ingest can remove.

    python bench/controller_scale_load/floor.py --ready-file PATH [--listeners N] [--event-loop LOOP]

It listens on a free loopback port and writes {"address": "127.0.0.1:PORT"} to PATH once serving;
SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from controller import event_loop
from controller.config import LimitsConfig
from controller.listeners import NO_BDP_PROBE, REUSEPORT, call_backlog, listen_on
from protos.gpufleet.v1 import telemetry_pb2 as pb
from protos.gpufleet.v1 import telemetry_pb2_grpc

# As the controller's server: agents' frames can be large (a probe round), and they ping.
OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_ping_strikes", 0),
    NO_BDP_PROBE,
    *call_backlog(LimitsConfig().max_nodes),
]


class FloorServicer(telemetry_pb2_grpc.TelemetryServicer):
    async def Stream(
        self, request_iterator: AsyncIterator[pb.AgentMessage], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.ControllerMessage]:
        messages = aiter(request_iterator)
        if await anext(messages, None) is None:  # the Hello: accepted as it is
            return
        await context.send_initial_metadata(())  # the agent sends frames once it sees this
        async for msg in messages:
            if msg.WhichOneof("msg") == "frame":
                yield pb.ControllerMessage(ack=pb.Ack(boot_id=msg.frame.boot_id, seq=msg.frame.seq))


async def serve(ready: Path, listeners: int) -> None:
    options = OPTIONS + ([REUSEPORT] if listeners > 1 else [])

    def build() -> grpc.aio.Server:
        server = grpc.aio.server(options=options)
        telemetry_pb2_grpc.add_TelemetryServicer_to_server(FloorServicer(), server)
        return server

    def bind(server: grpc.aio.Server, where: str) -> int:
        return server.add_insecure_port(where)

    servers, address = await listen_on("127.0.0.1:0", listeners, build, bind)
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    part = ready.with_suffix(".part")
    part.write_text(json.dumps({"address": address}))
    part.replace(ready)  # whole, or not there
    await stopping.wait()
    await servers.stop(grace=1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--ready-file", required=True, type=Path)
    parser.add_argument("--listeners", type=int, default=1, help="servers on the port, as the controller's")
    parser.add_argument("--event-loop", choices=event_loop.CHOICES, default="auto", help="as the controller")
    args = parser.parse_args()
    event_loop.run(serve(args.ready_file, args.listeners), args.event_loop)


if __name__ == "__main__":
    main()
