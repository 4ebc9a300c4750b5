"""Bad input cases 2 and 5 of issue 15 through a real server: forged sequence numbers and
out-of-range times are refused for good (INVALID_ARGUMENT naming the frame), never INTERNAL; later
real frames are acked, and what was stored converts to JSON."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc
import pytest

from controller.cli.jsonify import message_to_dict
from controller.config import LimitsConfig
from controller.ingest_checks import EARLIEST, MAX_FLOOR_JUMP
from controller.servicer import EOF
from protos.gpufleet.v1 import operator_pb2, operator_pb2_grpc, telemetry_pb2_grpc
from protos.gpufleet.v1 import telemetry_pb2 as pb
from protos.refusal import REFUSED_FRAME, refused_frame, refused_frame_value
from tests.controller.harness import (
    T0,
    Running,
    as_frame,
    as_hello,
    bmc_sample,
    config,
    frame,
    hello,
    running_controller,
)

if TYPE_CHECKING:
    Stub: TypeAlias = telemetry_pb2_grpc.TelemetryAsyncStub

AgentCall = grpc.aio.StreamStreamCall[pb.AgentMessage, pb.ControllerMessage]
SKEW = 60.0
EDGES = [2**63 - 1, 2**63, 2**64 - 1]


def serve(body: Callable[[Running, Stub], Awaitable[None]]) -> None:
    async def go() -> None:
        cfg = config(limits=LimitsConfig(max_clock_skew_seconds=SKEW))
        async with running_controller(cfg) as running, grpc.aio.insecure_channel(running.address) as channel:
            await body(running, telemetry_pb2_grpc.TelemetryStub(channel))

    asyncio.run(go())


async def connect(stub: Stub, *frames: pb.TelemetryFrame, node: str = "n1") -> AgentCall:
    """A stream that said Hello and had `frames` acked."""
    call: AgentCall = stub.Stream(None)
    await call.write(as_hello(hello(node)))
    for f in frames:
        await call.write(as_frame(f))
        while True:  # a reconnect is first told where its boot stands
            message = await call.read()
            assert isinstance(message, pb.ControllerMessage) and message.ack.seq <= f.seq, message
            if message.ack == pb.Ack(boot_id=f.boot_id, seq=f.seq):
                break
    return call


async def reply(call: AgentCall) -> pb.ControllerMessage:
    message = await call.read()
    assert isinstance(message, pb.ControllerMessage), message
    return message


async def refusal(call: AgentCall, bad: pb.TelemetryFrame) -> tuple[grpc.StatusCode, str, Any]:
    """Send `bad`; the stream must end with an error: its code, details and the frame it names."""
    await call.write(as_frame(bad))
    while True:
        try:
            message = await call.read()
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details() or "", refused_frame(exc.trailing_metadata())
        assert message != EOF, "the stream ended without an error"


async def still_acks(stub: Stub, seq: int, node: str = "n1") -> None:
    """A new stream of the node gets its next real frame acked, and closes cleanly."""
    call = await connect(stub, frame(seq, node), node=node)
    await call.done_writing()
    assert await call.read() == EOF and await call.code() == grpc.StatusCode.OK


@pytest.mark.parametrize("value", EDGES, ids=["2^63-1", "2^63", "2^64-1"])
@pytest.mark.parametrize("field", ["seq", "spool_floor_seq"])
def test_forged_sequence_numbers_are_refused_and_later_frames_acked(field: str, value: int) -> None:
    async def body(running: Running, stub: Stub) -> None:
        call = await connect(stub, frame(1))
        forged = frame(2)
        setattr(forged, field, value)
        code, details, named = await refusal(call, forged)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "2^48" in details
        assert named == ("b1", forged.seq)
        assert running.app.fleet.acked[("n1", "b1")] == 1 and running.app.ingest.counters.refused == 1
        await still_acks(stub, 2)
        await still_acks(stub, 3)
        stored, _ = await running.app.store.load()
        assert stored.acked[("n1", "b1")] == 3

    serve(body)


def test_a_spool_floor_may_skip_a_bounded_number_of_frames_and_only_of_its_own_boot() -> None:
    async def body(running: Running, stub: Stub) -> None:
        call = await connect(stub, frame(1))
        far = frame(2 + MAX_FLOOR_JUMP + 1)
        far.spool_floor_seq = far.seq
        at(far, T0)
        code, details, named = await refusal(call, far)
        assert (
            code == grpc.StatusCode.INVALID_ARGUMENT
            and "at most 2^24" in details
            and named == ("b1", far.seq)
        )
        edge = frame(2 + MAX_FLOOR_JUMP)  # a long outage: the agent dropped 2^24 frames
        edge.spool_floor_seq = edge.seq
        at(edge, T0)
        call = await connect(stub, edge)
        other = frame(7, boot="b-other")  # another boot of the node: its own position only
        other.spool_floor_seq = 7
        await call.write(as_frame(other))
        assert (await reply(call)).ack == pb.Ack(boot_id="b-other", seq=7)
        await call.done_writing()
        assert await call.read() == EOF
        assert running.app.fleet.acked[("n1", "b1")] == edge.seq
        assert running.app.fleet.acked[("n1", "b-other")] == 7
        # A frame naming another node cannot move that node's position either.
        await still_acks(stub, 1, node="n2")
        code, _, named = await refusal(await connect(stub), frame(2, node="n2"))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and named == ("b1", 2)
        assert running.app.fleet.acked[("n2", "b1")] == 1

    serve(body)


def at(frame_: pb.TelemetryFrame, seconds: float, nanos: int = 0) -> None:
    frame_.time.seconds, frame_.time.nanos = int(seconds), nanos


def _frame_time(f: pb.TelemetryFrame, t: float) -> None:
    at(f, t)


def _probe_time(f: pb.TelemetryFrame, t: float) -> None:
    f.probes[0].time.seconds = int(t)


def _bmc_time(f: pb.TelemetryFrame, t: float) -> None:
    f.bmc.CopyFrom(bmc_sample(T0))
    f.bmc.time.seconds = int(t)


def _xid_time(f: pb.TelemetryFrame, t: float) -> None:
    f.gpus[0].xid_events.add(code=79, unix_time_seconds=t)


SETTERS: dict[str, Callable[[pb.TelemetryFrame, float], None]] = {
    "time": _frame_time,
    "probes[0].time": _probe_time,
    "bmc.time": _bmc_time,
    "gpus[0].xid_events[0].unix_time_seconds": _xid_time,
}
BAD_TIMES = {
    "1999": (EARLIEST - 1, "before 2000-01-01"),
    "epoch": (0, "before 2000-01-01"),
    "negative": (-(2**62), "before 2000-01-01"),
    "ahead": (T0 + SKEW + 1, "ahead of the controller's clock"),
    "far-future": (2**62, "ahead of the controller's clock"),
}


@pytest.mark.parametrize("when", list(BAD_TIMES))
@pytest.mark.parametrize("field", list(SETTERS))
def test_out_of_range_times_are_refused_naming_the_field(field: str, when: str) -> None:
    value, why = BAD_TIMES[when]

    async def body(running: Running, stub: Stub) -> None:
        call = await connect(stub, frame(1))
        bad = frame(2)
        SETTERS[field](bad, value)
        code, details, named = await refusal(call, bad)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, details
        assert f"frame 2: {field} " in details and why in details and named == ("b1", 2)
        await still_acks(stub, 2)

    serve(body)


def test_nanos_out_of_range_and_a_nan_xid_time_are_refused() -> None:
    async def body(running: Running, stub: Stub) -> None:
        bad = frame(1)
        at(bad, T0, nanos=-1)
        code, details, _ = await refusal(await connect(stub), bad)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "time has nanos -1" in details
        bad = frame(1)
        _xid_time(bad, math.nan)
        code, details, _ = await refusal(await connect(stub), bad)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "unix_time_seconds is before 2000" in details
        await still_acks(stub, 1)

    serve(body)


@pytest.mark.parametrize("seconds", [0, EARLIEST - 1, 2**62, -(2**62)])
def test_a_hello_with_an_impossible_start_time_is_refused(seconds: int) -> None:
    async def body(running: Running, stub: Stub) -> None:
        call: AgentCall = stub.Stream(None)
        msg = hello()
        msg.started_at.seconds = seconds
        await call.write(as_hello(msg))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call.read()
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "hello: started_at is" in (caught.value.details() or "")
        assert "n1" not in running.app.fleet.nodes

    serve(body)


def test_times_at_the_edges_are_stored_and_convert_to_json() -> None:
    """The earliest and the latest accepted times, in every time field: `gpufleet node n1 -o json`
    converts what was stored."""

    async def body(running: Running, stub: Stub) -> None:
        edge = frame(1)
        at(edge, EARLIEST)
        _probe_time(edge, T0 + SKEW)
        _bmc_time(edge, EARLIEST)
        _xid_time(edge, T0 + SKEW)
        first = hello()
        first.started_at.seconds = EARLIEST
        call: AgentCall = stub.Stream(None)
        await call.write(as_hello(first))
        await call.write(as_frame(edge))
        assert (await reply(call)).ack.seq == 1
        await call.done_writing()
        assert await call.read() == EOF
        async with grpc.aio.insecure_channel(running.address) as channel:
            detail = await operator_pb2_grpc.OperatorStub(channel).GetNode(
                operator_pb2.GetNodeRequest(name="n1")
            )
        text = json.dumps(message_to_dict(detail))
        assert "2000-01-01T00:00:00Z" in text

    serve(body)


def test_a_refused_frame_whose_boot_id_metadata_cannot_carry_is_refused_without_naming_it() -> None:
    async def body(running: Running, stub: Stub) -> None:
        call: AgentCall = stub.Stream(None)
        await call.write(as_hello(hello(boot="boot with spaces")))
        code, details, named = await refusal(call, frame(1, node="n2", boot="boot with spaces"))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "'n2'" in details and named is None

    serve(body)


def test_the_refusal_metadata_round_trips() -> None:
    value = refused_frame_value("0123abcdef", 2**64 - 1)
    assert value == f"0123abcdef {2**64 - 1}"
    assert refused_frame([("other", "x"), (REFUSED_FRAME, value)]) == ("0123abcdef", 2**64 - 1)
    assert refused_frame_value("a\nb", 1) is None and refused_frame_value("b", -1) is None
    assert refused_frame([(REFUSED_FRAME, "b1 x")]) is None and refused_frame(None) is None
