"""The telemetry stream over real gRPC: servicer, error interceptor and server options together.

Every case ends by checking that the server still serves a fresh client.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import sqlite3
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc
import pytest

from controller.errors import StoreUnavailable
from controller.servicer import EOF
from controller.store.store import Store
from protos.gpufleet.v1 import telemetry_pb2 as pb
from protos.gpufleet.v1 import telemetry_pb2_grpc
from tests.controller.harness import (
    Running,
    as_frame,
    as_hello,
    config,
    frame,
    hello,
    running_controller,
)

if TYPE_CHECKING:  # the async stub exists only in the generated type stubs
    Stub: TypeAlias = telemetry_pb2_grpc.TelemetryAsyncStub

Body = Callable[[Running, "Stub"], Awaitable[None]]
StreamCall = grpc.aio.StreamStreamCall[Any, Any]
AgentCall = grpc.aio.StreamStreamCall[pb.AgentMessage, pb.ControllerMessage]
METHOD = "/gpufleet.v1.Telemetry/Stream"
_fresh = itertools.count()
TRANSPORT = {"fronts": 0}  # the ingest fronts the controller runs (the `fronts` fixture)


@pytest.fixture(autouse=True, params=[0, 2], ids=["direct", "fronts"])
def fronts(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every case twice: agents on the controller's own port, and through two ingest fronts
    (controller/fronts/), which must answer every agent exactly as the controller does."""
    TRANSPORT["fronts"] = request.param
    yield
    TRANSPORT["fronts"] = 0


def serve(body: Body, **overrides: Any) -> None:
    async def go() -> None:
        async with running_controller(config(**overrides), fronts=TRANSPORT["fronts"]) as running:
            async with grpc.aio.insecure_channel(running.address) as channel:
                await body(running, telemetry_pb2_grpc.TelemetryStub(channel))
            await assert_still_serves(running)

    asyncio.run(go())


async def assert_still_serves(running: Running) -> None:
    """A new client on a new connection gets its first frame acked."""
    node = f"fresh-{next(_fresh)}"
    async with grpc.aio.insecure_channel(running.address) as channel:
        call = telemetry_pb2_grpc.TelemetryStub(channel).Stream(None)
        await call.write(as_hello(hello(node)))
        await call.write(as_frame(frame(1, node)))
        assert await reply(call) == pb.ControllerMessage(ack=pb.Ack(boot_id="b1", seq=1))
        await call.done_writing()
        assert await call.read() == EOF
        assert await call.code() == grpc.StatusCode.OK


async def error_of(call: StreamCall) -> tuple[grpc.StatusCode, str]:
    """Read until the call ends; it must end with an error status."""
    while True:
        try:
            message = await call.read()
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details() or ""
        assert message != EOF, "the stream ended without an error"


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def stream_tasks() -> list[asyncio.Task[Any]]:
    """The tasks a stream runs beside its handler (its reader, its wait for a newer stream): a stream
    that ended must leave none behind."""
    return [t for t in asyncio.all_tasks() if not t.done() and t.get_name().startswith("stream ")]


async def reply(call: AgentCall) -> pb.ControllerMessage:
    message = await call.read()
    assert isinstance(message, pb.ControllerMessage), message
    return message


async def ack(call: AgentCall) -> tuple[str, int]:
    message = await reply(call)
    assert message.WhichOneof("msg") == "ack", message
    return message.ack.boot_id, message.ack.seq


def test_hello_then_frames_are_acked_with_the_stored_seq() -> None:
    async def body(running: Running, stub: Stub) -> None:
        call = stub.Stream(None)
        await call.write(as_hello(hello()))
        for seq in (1, 2, 3):
            await call.write(as_frame(frame(seq)))
            assert await ack(call) == ("b1", seq)
        assert running.app.fleet.nodes["n1"].connected
        assert running.app.fleet.nodes["n1"].gpus[0].sample.power_watts == 403.0
        await call.write(pb.AgentMessage(command_result=pb.CommandResult(command_id="c", ok=True)))
        await call.done_writing()
        assert await call.read() == EOF
        assert await call.code() == grpc.StatusCode.OK
        assert running.app.fleet.acked[("n1", "b1")] == 3
        assert not running.app.fleet.nodes["n1"].connected
        assert stream_tasks() == []

    serve(body)


def test_duplicate_frame_is_acked_but_stored_once(tmp_path: Path) -> None:
    db = tmp_path / "c.db"

    async def body(running: Running, stub: Stub) -> None:
        call = stub.Stream(None)
        await call.write(as_hello(hello()))
        replies = []
        for seq in (1, 2, 2, 3, 1):
            await call.write(as_frame(frame(seq)))
            replies.append(await ack(call))
        assert replies == [("b1", 1), ("b1", 2), ("b1", 2), ("b1", 3), ("b1", 3)]
        await call.done_writing()
        assert await call.code() == grpc.StatusCode.OK
        counters = running.app.ingest.counters
        assert (counters.frames, counters.duplicates) == (3, 2)

        with sqlite3.connect(db) as conn:  # what is on disk, read beside the controller's connection
            (points,) = conn.execute("SELECT points FROM probe_series").fetchone()
            assert len(points) == 3 * 16  # three results (time, value) as doubles: no duplicate's
            assert conn.execute("SELECT count(*) FROM probe_history").fetchone() == (0,)  # not written
            assert conn.execute("SELECT acked_seq FROM boots").fetchall() == [(3,)]

        again = stub.Stream(None)  # a reconnect learns where it stands before sending anything
        await again.write(as_hello(hello()))
        assert await ack(again) == ("b1", 3)
        await again.done_writing()
        assert await again.code() == grpc.StatusCode.OK

    serve(body, db=str(db))


def test_frame_for_another_node_is_invalid_argument() -> None:
    async def body(running: Running, stub: Stub) -> None:
        call = stub.Stream(None)
        await call.write(as_hello(hello("n1")))
        await call.write(as_frame(frame(1, node="n2")))
        code, details = await error_of(call)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "'n2'" in details and "'n1'" in details
        assert "n2" not in running.app.fleet.nodes and running.app.fleet.acked[("n1", "b1")] == 0

    serve(body)


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([as_frame(frame(1))], "first message on a stream must be a Hello"),
        ([pb.AgentMessage()], "first message on a stream must be a Hello"),
        ([as_hello(hello()), as_hello(hello())], "Hello is allowed only as the first message"),
        ([as_hello(hello()), pb.AgentMessage()], "empty or unknown agent message"),
        ([as_hello(pb.Hello(node="", boot_id="b1"))], "node name must be 1..253 characters"),
        ([as_hello(pb.Hello(node="n1"))], "boot_id is required"),
    ],
    ids=["frame-first", "empty-first", "second-hello", "empty-later", "no-node", "no-boot"],
)
def test_out_of_protocol_messages_are_invalid_argument(
    messages: list[pb.AgentMessage], expected: str
) -> None:
    async def body(running: Running, stub: Stub) -> None:
        call = stub.Stream(None)
        for message in messages:
            await call.write(message)
        code, details = await error_of(call)
        assert (code, expected in details) == (grpc.StatusCode.INVALID_ARGUMENT, True), details
        await until(lambda: all(n == 0 for n in running.app.connections.values()))

    serve(body)


def test_sequence_gap_is_out_of_range_until_the_agent_resends() -> None:
    async def body(running: Running, stub: Stub) -> None:
        call = stub.Stream(None)
        await call.write(as_hello(hello()))
        await call.write(as_frame(frame(1)))
        assert await ack(call) == ("b1", 1)
        await call.write(as_frame(frame(3)))
        code, details = await error_of(call)
        assert code == grpc.StatusCode.OUT_OF_RANGE
        assert "expected frame 2, got 3" in details
        assert running.app.fleet.acked[("n1", "b1")] == 1

        resend = stub.Stream(None)
        await resend.write(as_hello(hello()))
        assert await ack(resend) == ("b1", 1)
        for seq in (2, 3):
            await resend.write(as_frame(frame(seq)))
            assert await ack(resend) == ("b1", seq)
        await resend.done_writing()
        assert await resend.code() == grpc.StatusCode.OK

    serve(body)


@pytest.mark.parametrize("after_hello", [False, True], ids=["first", "after-hello"])
def test_malformed_bytes_are_refused_and_the_next_client_is_served(after_hello: bool) -> None:
    async def body(running: Running, stub: Stub) -> None:
        async with grpc.aio.insecure_channel(running.address) as channel:
            raw = channel.stream_stream(
                METHOD, request_serializer=lambda b: b, response_deserializer=lambda b: b
            )
            call: StreamCall = raw(None)
            if after_hello:
                await call.write(as_hello(hello()).SerializeToString())
                await until(lambda: running.app.connections.get("n1") == 1)
            await call.write(b"\xff\xff\xff\xff not a protobuf")
            code, details = await error_of(call)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
        assert "malformed AgentMessage" in details
        await until(lambda: running.app.connections.get("n1", 0) == 0)
        assert stream_tasks() == []

    serve(body)


def test_oversize_message_is_resource_exhausted() -> None:
    async def body(running: Running, stub: Stub) -> None:
        call = stub.Stream(None)
        await call.write(as_hello(hello(agent_version="x" * 100_000)))
        code, details = await error_of(call)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
        assert running.app.fleet.nodes == {}

    serve(body, max_message_bytes=64 * 1024)


def test_oversize_frame_mid_stream_ends_the_stream_cleanly() -> None:
    async def body(running: Running, stub: Stub) -> None:
        call = stub.Stream(None)
        await call.write(as_hello(hello()))
        await call.write(as_frame(frame(1)))
        assert await ack(call) == ("b1", 1)
        big = frame(2)
        for i in range(1, 2000):
            big.gpus.add(index=i, uuid=f"GPU-{i:036d}")
        assert big.ByteSize() > 64 * 1024
        await call.write(as_frame(big))
        code, _ = await error_of(call)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        await until(lambda: running.app.connections["n1"] == 0 and not stream_tasks())
        assert not running.app.fleet.nodes["n1"].connected
        assert running.app.fleet.acked[("n1", "b1")] == 1

    serve(body, max_message_bytes=64 * 1024)


def test_client_cancel_disconnects_the_node_and_leaves_no_task_behind() -> None:
    async def body(running: Running, stub: Stub) -> None:
        call = stub.Stream(None)
        await call.write(as_hello(hello()))
        await call.write(as_frame(frame(1)))
        assert await ack(call) == ("b1", 1)
        assert running.app.connections["n1"] == 1
        call.cancel()
        await until(lambda: running.app.connections["n1"] == 0 and not stream_tasks())
        assert not running.app.fleet.nodes["n1"].connected

    serve(body)


def test_probe_run_is_asked_once_per_boot_of_a_capable_agent() -> None:
    async def body(running: Running, stub: Stub) -> None:
        ids = []
        for boot, seq in (("b1", 1), ("b1", 2), ("b2", 1)):
            call = stub.Stream(None)
            await call.write(as_hello(hello(boot=boot, capabilities=["run_probes"])))
            if seq > 1:
                assert await ack(call) == (boot, seq - 1)  # where the boot stands
            first = await reply(call)
            assert first.WhichOneof("msg") == "command"
            assert first.command.WhichOneof("action") == "run_probes" and first.command.id
            ids.append(first.command.id)
            await call.write(as_frame(frame(seq, boot=boot)))
            assert await ack(call) == (boot, seq)
            await call.done_writing()
            assert await call.code() == grpc.StatusCode.OK
        # The same boot reconnecting is sent its unanswered command again (same id), not a new one;
        # a new boot gets a new one, and the old boot's command failed with it.
        assert ids[0] == ids[1] != ids[2]
        old = running.app.commands.get(ids[0])
        assert old is not None and old.state == "failed"
        assert old.error == "the agent restarted before answering"

    serve(body)


def test_nan_and_inf_readings_are_stored_as_missing(tmp_path: Path) -> None:
    db = tmp_path / "c.db"

    async def body(running: Running, stub: Stub) -> None:
        f = frame(1)
        f.gpus[0].temperature_celsius = math.nan
        f.gpus[0].sm_clock_hz = math.inf
        f.host.load1 = -math.inf
        f.host.cpu_utilization_ratio = 0.5
        call = stub.Stream(None)
        await call.write(as_hello(hello()))
        await call.write(as_frame(f))
        assert await ack(call) == ("b1", 1)
        await call.done_writing()
        assert await call.code() == grpc.StatusCode.OK
        node = running.app.fleet.nodes["n1"]
        sample = node.gpus[0].sample
        assert not sample.HasField("temperature_celsius") and not sample.HasField("sm_clock_hz")
        assert sample.power_watts == 401.0
        assert node.host is not None and not node.host.HasField("load1")
        assert running.app.ingest.counters.non_finite == 3

    serve(body, db=str(db))

    async def reload() -> None:  # what was stored, not only what memory shows
        store = Store(str(db))
        await store.open()
        try:
            fleet, _ = await store.load()
        finally:
            store.close()
        sample = fleet.nodes["n1"].gpus[0].sample
        assert not sample.HasField("temperature_celsius") and not sample.HasField("sm_clock_hz")
        assert sample.power_watts == 401.0
        host = fleet.nodes["n1"].host
        assert host is not None and not host.HasField("load1") and host.cpu_utilization_ratio == 0.5

    asyncio.run(reload())


@pytest.mark.parametrize(
    ("error", "code", "details"),
    [
        (StoreUnavailable("disk full"), grpc.StatusCode.UNAVAILABLE, "disk full"),
        (
            RuntimeError("secret internals"),
            grpc.StatusCode.INTERNAL,
            "internal error (see the controller log)",
        ),
    ],
    ids=["store-down", "unexpected"],
)
def test_handler_errors_become_statuses(error: Exception, code: grpc.StatusCode, details: str) -> None:
    async def body(running: Running, stub: Stub) -> None:
        ingest_frame = running.app.ingest.frame

        async def broken(node: str, f: pb.TelemetryFrame, *_: object) -> int:
            raise error

        running.app.ingest.frame = broken  # type: ignore[method-assign,assignment]
        call = stub.Stream(None)
        await call.write(as_hello(hello()))
        await call.write(as_frame(frame(1)))
        assert await error_of(call) == (code, details)
        assert running.app.fleet.acked[("n1", "b1")] == 0
        running.app.ingest.frame = ingest_frame  # type: ignore[method-assign]

    serve(body)


def test_a_stream_that_ends_mid_ingest_leaves_store_and_memory_agreeing() -> None:
    """The agent hangs up (a reconnect) while its frame is being stored: the ingest finishes anyway,
    so the next Hello's ack position is a frame memory has applied too; the stream's reader then
    writes nothing and ends."""

    async def body(running: Running, stub: Stub) -> None:
        app = running.app
        saving, release = asyncio.Event(), asyncio.Event()
        save_frame = app.store.save_frame

        async def slow_save(write: Any) -> None:
            saving.set()
            await release.wait()
            await save_frame(write)

        app.store.save_frame = slow_save  # type: ignore[method-assign]
        call = stub.Stream(None)
        await call.write(as_hello(hello()))
        await call.write(as_frame(frame(1)))
        await saving.wait()
        call.cancel()  # the stream ends while the frame is being written
        if not TRANSPORT["fronts"]:  # (a front tells the controller the agent half-closed it)
            await until(lambda: app.connections["n1"] == 0)
            assert app.ingest.counters.frames == 0
            assert [t.get_name() for t in stream_tasks()] == ["stream n1 reader"]  # finishing its frame
        release.set()
        await until(
            lambda: app.ingest.counters.frames == 1 and app.connections["n1"] == 0 and not stream_tasks()
        )
        app.store.save_frame = save_frame  # type: ignore[method-assign]
        assert app.fleet.acked[("n1", "b1")] == 1
        assert await app.ingest.hello(hello("n1")) == 1  # the store agrees

    serve(body)


def test_a_stream_holds_nothing_of_a_message_while_it_waits_for_the_next() -> None:
    """An agent's frames come about ten seconds apart: meanwhile its stream's reader keeps no reference
    to the last one (its bytes, their parse), which every stream of the fleet would hold."""

    async def body(running: Running, stub: Stub) -> None:
        call = stub.Stream(None)
        await call.write(as_hello(hello()))
        await call.write(as_frame(frame(1)))
        assert await ack(call) == ("b1", 1)
        [reader] = [t for t in stream_tasks() if t.get_name() == "stream n1 reader"]
        coro: Any = reader.get_coro()
        await until(lambda: getattr(coro.cr_await, "__qualname__", "") == "next_message")
        held = [type(v).__name__ for v in coro.cr_frame.f_locals.values()]
        assert not set(held) & {"AgentMessage", "Received", "PlannedFrame", "TelemetryFrame", "bytes"}, held
        await call.done_writing()
        assert await call.read() == EOF

    serve(body)


def test_commands_and_acks_written_from_both_sides_all_arrive() -> None:
    """Acks are written by the stream's reader, commands by its handler, one write at a time: issued
    while frames stream, every command and every ack reaches the agent, in the order each side wrote."""

    async def body(running: Running, stub: Stub) -> None:
        call = stub.Stream(None)
        await call.write(as_hello(hello()))
        await call.write(as_frame(frame(1)))
        assert await ack(call) == ("b1", 1)
        issued = []
        for seq in range(2, 22):
            await call.write(as_frame(frame(seq)))
            command = pb.Command(run_probes=pb.RunProbes())
            issued.append((await running.app.commands.issue("n1", command, "operator:alice")).id)
        acks: list[int] = []
        commands: list[str] = []
        while len(acks) < 20 or len(commands) < 20:
            message = await reply(call)
            if message.WhichOneof("msg") == "ack":
                acks.append(message.ack.seq)
            else:
                commands.append(message.command.id)
        assert acks == list(range(2, 22))
        assert commands == issued
        await call.done_writing()
        assert await call.read() == EOF
        assert await call.code() == grpc.StatusCode.OK

    serve(body)
