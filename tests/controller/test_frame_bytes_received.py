"""A frame goes to the detection process in the bytes its agent sent, over a real gRPC stream: not
serialized again on the controller's event loop, unless screening cleared a reading."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping

import grpc

from controller.fleet.model import ProbeKey
from controller.fleet.series import Series
from controller.fleet.state import FramePlan
from controller.store.stored_nodes import StoredNodes
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.harness import as_hello, frame, hello, running_controller

METHOD = "/gpufleet.v1.Telemetry/Stream"


class _Mirror:
    """Records the frames ingest sends the detection process."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def hello(self, hello: pb.Hello, acked: int, now: float) -> None:
        pass

    def frame(self, node: str, plan: FramePlan, data: bytes) -> None:
        self.frames.append(data)

    def adopt(self, stored: StoredNodes, heard: Mapping[str, float]) -> None:
        pass

    def history(self, history: Mapping[ProbeKey, Series]) -> None:
        pass


def _as_sent(msg: pb.TelemetryFrame) -> bytes:
    """The frame's bytes as an agent might send them: valid, but not as protobuf would write them
    again (the header after the readings; a parser merges both parts)."""
    header = pb.TelemetryFrame(node=msg.node, boot_id=msg.boot_id, seq=msg.seq)
    header.time.CopyFrom(msg.time)
    body = pb.TelemetryFrame()
    body.CopyFrom(msg)
    for name in ("node", "boot_id", "seq", "time"):
        body.ClearField(name)
    return body.SerializeToString() + header.SerializeToString()


def _agent_message(frame_bytes: bytes) -> bytes:
    """AgentMessage.frame (field 2, length-delimited) holding these bytes."""
    size, length = bytearray(), len(frame_bytes)
    while length >= 0x80:
        size.append(length & 0x7F | 0x80)
        length >>= 7
    size.append(length)
    return b"\x12" + bytes(size) + frame_bytes


def test_a_frame_reaches_the_detection_process_as_its_agent_sent_it() -> None:
    async def go() -> None:
        async with running_controller() as running:
            mirror = _Mirror()
            running.app.ingest.mirror = mirror
            clean, dirty = frame(1), frame(2)
            dirty.gpus[0].temperature_celsius = math.nan  # cleared by screening
            sent = [_as_sent(clean), _as_sent(dirty)]
            assert sent[0] != clean.SerializeToString()
            async with grpc.aio.insecure_channel(running.address) as channel:
                stream = channel.stream_stream(
                    METHOD,
                    request_serializer=lambda b: b,
                    response_deserializer=pb.ControllerMessage.FromString,
                )
                call = stream(None)  # aio: no iterator, then call.write
                await call.write(as_hello(hello()).SerializeToString())
                await call.initial_metadata()
                for data in sent:
                    await call.write(_agent_message(data))
                acked = 0
                while acked < 2:
                    message = await asyncio.wait_for(call.read(), 10)
                    assert isinstance(message, pb.ControllerMessage), message
                    acked = max(acked, message.ack.seq)
                call.cancel()
            assert mirror.frames[0] == sent[0]  # the bytes received, not encoded again
            again = pb.TelemetryFrame.FromString(mirror.frames[1])  # the frame as screened
            assert not again.gpus[0].HasField("temperature_celsius")
            assert again.gpus[0].power_watts == dirty.gpus[0].power_watts

    asyncio.run(go())
