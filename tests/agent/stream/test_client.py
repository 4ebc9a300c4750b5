"""StreamClient against a real grpc.aio server on loopback, and the Agent when the controller is away.

The fake controller records every message per stream, acks frames (up to a limit, or not at all)
and sends whatever a test puts in its outbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.config import load
from agent.daemon import Agent
from agent.sources.sim import SimNode
from agent.sources.sim.host import SimHost
from agent.sources.sim.probes import ModelledProbes
from agent.stream import client as stream_client
from agent.stream.backoff import Backoff
from agent.stream.client import StreamClient
from agent.stream.spool import Spool
from protos.gpufleet.v1 import telemetry_pb2 as pb
from protos.gpufleet.v1 import telemetry_pb2_grpc
from tests.support import free_port

BOOT = "boot-1"
LOG = "tests.agent.stream.client"
TIMEOUT = 5.0


class FakeController(telemetry_pb2_grpc.TelemetryServicer):
    def __init__(self, *, ack_up_to: int | None = 10**9) -> None:
        self.ack_up_to = ack_up_to  # None: never ack
        self.streams: list[list[pb.AgentMessage]] = []
        self.on_hello: list[pb.ControllerMessage] = []  # sent right after each Hello
        self._outbox: asyncio.Queue[pb.ControllerMessage | None] | None = None

    async def Stream(
        self, request_iterator: AsyncIterator[pb.AgentMessage], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.ControllerMessage]:
        received: list[pb.AgentMessage] = []
        self.streams.append(received)
        outbox: asyncio.Queue[pb.ControllerMessage | None] = asyncio.Queue()
        self._outbox = outbox

        async def read() -> None:
            async for msg in request_iterator:
                received.append(msg)
                kind = msg.WhichOneof("msg")
                if kind == "hello":
                    for reply in self.on_hello:
                        outbox.put_nowait(reply)
                elif kind == "frame" and self.ack_up_to is not None:
                    seq = min(msg.frame.seq, self.ack_up_to)
                    outbox.put_nowait(pb.ControllerMessage(ack=pb.Ack(boot_id=msg.frame.boot_id, seq=seq)))
            outbox.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (reply := await outbox.get()) is not None:
                yield reply
        finally:
            reader.cancel()

    def send(self, msg: pb.ControllerMessage) -> None:
        assert self._outbox is not None, "no stream yet"
        self._outbox.put_nowait(msg)

    def received(self, stream: int = -1) -> list[pb.AgentMessage]:
        return self.streams[stream] if self.streams else []

    def frame_seqs(self, stream: int = -1) -> list[int]:
        return [m.frame.seq for m in self.received(stream) if m.WhichOneof("msg") == "frame"]

    def of_kind(self, kind: str) -> list[pb.AgentMessage]:
        return [m for stream in self.streams for m in stream if m.WhichOneof("msg") == kind]


@contextlib.asynccontextmanager
async def serving(servicer: FakeController, port: int = 0) -> AsyncIterator[str]:
    server = grpc.aio.server()
    telemetry_pb2_grpc.add_TelemetryServicer_to_server(servicer, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    assert bound, f"cannot listen on 127.0.0.1:{port}"
    await server.start()
    try:
        yield f"127.0.0.1:{bound}"
    finally:
        await server.stop(None)


@contextlib.asynccontextmanager
async def running(run: Callable[[asyncio.Event], Coroutine[Any, Any, None]]) -> AsyncIterator[asyncio.Event]:
    """Run `run(stop)` as a task; on exit set stop and require it to end promptly and cleanly."""
    stop = asyncio.Event()
    task = asyncio.create_task(run(stop))
    try:
        yield stop
    finally:
        stop.set()
        await asyncio.wait_for(task, TIMEOUT)  # re-raises whatever ended the task


async def until(condition: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def frame(seq: int) -> pb.TelemetryFrame:
    f = pb.TelemetryFrame(node="n1", boot_id=BOOT, seq=seq)
    f.time.FromSeconds(1_800_000_000 + seq)
    return f


def hello() -> pb.Hello:
    return pb.Hello(node="n1", boot_id=BOOT, agent_version="test", probes=["gemm"])


async def refuse(command: pb.Command) -> pb.CommandResult:
    raise AssertionError(f"unexpected command {command}")


class RecordingBackoff(Backoff):
    """Small delays, and a record of every attempt number asked for."""

    def __init__(self, initial: float = 0.01, cap: float = 0.05) -> None:
        super().__init__(initial, cap)
        self.attempts: list[int] = []

    def delay(self, attempt: int) -> float:
        self.attempts.append(attempt)
        return super().delay(attempt)


def make_client(
    target: str,
    spool: Spool,
    on_command: Callable[[pb.Command], Coroutine[Any, Any, pb.CommandResult]] = refuse,
    backoff: Backoff | None = None,
) -> StreamClient:
    return StreamClient(
        target,
        spool,
        hello,
        on_command,
        backoff=backoff or Backoff(0.01, 0.05),
        log=logging.getLogger(LOG),
    )


def spooled(*seqs: int) -> Spool:
    spool = Spool(None)
    for seq in seqs:
        spool.append(frame(seq))
    return spool


def held(spool: Spool) -> list[int]:
    out, cursor = [], -1
    while (entry := spool.next_after(cursor)) is not None:
        out.append(entry.seq)
        cursor = entry.ordinal
    return out


def warning_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOG and r.levelno == logging.WARNING]


# -- StreamClient with a controller -----------------------------------------------------------


def test_hello_first_then_spooled_frames_in_order() -> None:
    async def scenario() -> None:
        controller = FakeController(ack_up_to=None)
        spool = spooled(1, 2, 3)
        async with serving(controller) as target:
            client = make_client(target, spool)
            async with running(client.run):
                await until(lambda: len(controller.received()) == 4, "hello and three frames")
                first = controller.received()[0]
                assert first.WhichOneof("msg") == "hello" and first.hello == hello()
                assert controller.frame_seqs() == [1, 2, 3]
                assert all(m.frame.spool_floor_seq == 1 for m in controller.received()[1:])
                # A frame spooled later goes out as soon as the client is told.
                spool.append(frame(4))
                client.notify()
                await until(lambda: controller.frame_seqs() == [1, 2, 3, 4], "frame 4")
            assert len(controller.streams) == 1
            assert held(spool) == [1, 2, 3, 4]  # nothing was acked, so nothing was released

    asyncio.run(scenario())


def test_acks_release_frames_from_the_spool() -> None:
    async def scenario() -> None:
        controller = FakeController(ack_up_to=2)
        spool = spooled(1, 2, 3)
        async with serving(controller) as target:
            client = make_client(target, spool)
            async with running(client.run):
                await until(lambda: held(spool) == [3], "acks of 1 and 2")
                assert client.connected
                controller.ack_up_to = 10**9
                spool.append(frame(4))
                client.notify()
                await until(lambda: len(spool) == 0, "acks of 3 and 4")
                assert controller.frame_seqs() == [1, 2, 3, 4]
                # Frame 4 went out after 1 and 2 were acked: it tells the controller so.
                assert controller.received()[-1].frame.spool_floor_seq == 3
        assert not client.connected

    asyncio.run(scenario())


def test_a_command_reaches_the_agent_and_its_result_goes_back() -> None:
    async def scenario() -> None:
        seen: list[pb.Command] = []

        async def on_command(command: pb.Command) -> pb.CommandResult:
            seen.append(command)
            return pb.CommandResult(command_id=command.id, ok=True)

        controller = FakeController()
        controller.on_hello = [
            pb.ControllerMessage(command=pb.Command(id="cmd-1", run_probes=pb.RunProbes(probes=["gemm"])))
        ]
        async with serving(controller) as target:
            client = make_client(target, spooled(1), on_command)
            async with running(client.run):
                await until(lambda: bool(controller.of_kind("command_result")), "the command result")
        assert [(c.id, list(c.run_probes.probes)) for c in seen] == [("cmd-1", ["gemm"])]
        (result,) = controller.of_kind("command_result")
        assert result.command_result == pb.CommandResult(command_id="cmd-1", ok=True)

    asyncio.run(scenario())


def test_a_failing_command_handler_is_answered_and_the_stream_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        async def on_command(command: pb.Command) -> pb.CommandResult:
            raise RuntimeError("probes unavailable: no torch")

        controller = FakeController()
        spool = spooled(1)
        async with serving(controller) as target:
            client = make_client(target, spool, on_command)
            async with running(client.run):
                await until(lambda: controller.frame_seqs() == [1], "frame 1")
                controller.send(pb.ControllerMessage(command=pb.Command(id="c2", run_probes=pb.RunProbes())))
                await until(lambda: bool(controller.of_kind("command_result")), "the command result")
                spool.append(frame(2))
                client.notify()
                await until(lambda: controller.frame_seqs() == [1, 2], "frame 2")
        (result,) = controller.of_kind("command_result")
        assert result.command_result == pb.CommandResult(
            command_id="c2", ok=False, error="probes unavailable: no torch"
        )
        assert len(controller.streams) == 1

    with caplog.at_level(logging.INFO, logger=LOG):
        asyncio.run(scenario())
    assert any(r.getMessage() == "command c2 failed" and r.exc_info for r in caplog.records)


# -- StreamClient without a controller --------------------------------------------------------


def test_unreachable_controller_one_warning_per_backoff_step(caplog: pytest.LogCaptureFixture) -> None:
    target = f"127.0.0.1:{free_port()}"
    backoff = RecordingBackoff()
    spool = spooled(1, 2)

    async def scenario() -> None:
        client = make_client(target, spool, backoff=backoff)
        stop = asyncio.Event()
        task = asyncio.create_task(client.run(stop))
        await until(lambda: len(backoff.attempts) >= 4, "four failed attempts")
        assert not client.connected and not task.done()
        stop.set()
        await asyncio.wait_for(task, 1.0)

    with caplog.at_level(logging.WARNING, logger=LOG):
        asyncio.run(scenario())
    lines = warning_lines(caplog)
    assert len(lines) == len(backoff.attempts) >= 4
    assert backoff.attempts == list(range(len(lines)))  # never heard from: each delay is the next step
    for number, line in enumerate(lines, start=1):
        assert line.startswith(f"controller {target}: UNAVAILABLE: ")
        assert f"; retry {number} in " in line and line.endswith("(2 frames spooled)")
    assert held(spool) == [1, 2]


def test_stop_ends_a_client_that_is_waiting_out_a_long_backoff() -> None:
    async def scenario() -> None:
        backoff = RecordingBackoff(60.0, 60.0)
        client = make_client(f"127.0.0.1:{free_port()}", spooled(1), backoff=backoff)
        stop = asyncio.Event()
        task = asyncio.create_task(client.run(stop))
        await until(lambda: backoff.attempts == [0], "the first failure")  # now in a 30..60 s wait
        await asyncio.sleep(0.01)
        assert not task.done()
        stop.set()
        await asyncio.wait_for(task, 1.0)

    asyncio.run(scenario())


def test_frames_spooled_while_down_are_sent_when_the_controller_comes_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()
    backoff = RecordingBackoff()

    async def scenario() -> None:
        controller = FakeController()
        spool = spooled(1, 2)
        client = make_client(f"127.0.0.1:{port}", spool, backoff=backoff)
        async with running(client.run):
            await until(lambda: len(backoff.attempts) >= 2, "two failed attempts")
            spool.append(frame(3))
            client.notify()
            async with serving(controller, port):
                await until(lambda: len(spool) == 0, "every frame acked")
                kinds = [m.WhichOneof("msg") for m in controller.received()]
                assert kinds == ["hello", "frame", "frame", "frame"]
                assert controller.frame_seqs() == [1, 2, 3]

    with caplog.at_level(logging.WARNING, logger=LOG):
        asyncio.run(scenario())


def test_unacked_frames_are_resent_after_a_controller_restart() -> None:
    port = free_port()

    async def scenario() -> None:
        spool = spooled(1, 2, 3)
        client = make_client(f"127.0.0.1:{port}", spool)
        async with running(client.run):
            first = FakeController(ack_up_to=2)  # stores 1 and 2, then goes away before acking 3
            async with serving(first, port):
                await until(lambda: held(spool) == [3], "acks of 1 and 2")
                await until(lambda: first.frame_seqs() == [1, 2, 3], "frame 3 sent")
            spool.append(frame(4))  # made while the controller was down
            client.notify()
            second = FakeController()
            async with serving(second, port):
                await until(lambda: len(spool) == 0, "every frame acked")
                kinds = [m.WhichOneof("msg") for m in second.received()]
                assert kinds == ["hello", "frame", "frame"]
                assert second.frame_seqs() == [3, 4]  # what was not acked, in order; nothing acked twice
                assert second.received()[1].frame.spool_floor_seq == 3
            assert len(second.streams) == 1

    asyncio.run(scenario())


class FinishedCall:
    """A stream whose RPC ends after the Hello while the reader has not yet seen the end."""

    def __init__(self) -> None:
        self.writes: list[pb.AgentMessage] = []

    async def write(self, msg: pb.AgentMessage) -> None:
        if self.writes:
            raise asyncio.InvalidStateError("RPC already finished.")  # what grpc.aio raises then
        self.writes.append(msg)

    async def done_writing(self) -> None:
        pass

    async def initial_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()  # the RPC ended: grpc.aio answers its (empty) initial metadata at once

    def cancel(self) -> bool:
        return True

    def __aiter__(self) -> FinishedCall:
        return self

    async def __anext__(self) -> pb.ControllerMessage:
        await asyncio.Event().wait()
        raise StopAsyncIteration


def test_a_write_that_races_the_end_of_the_rpc_is_retried(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[FinishedCall] = []

    class Stub:
        def __init__(self, channel: grpc.aio.Channel) -> None:
            pass

        def Stream(self) -> FinishedCall:
            calls.append(FinishedCall())
            return calls[-1]

    monkeypatch.setattr(telemetry_pb2_grpc, "TelemetryStub", Stub)
    monkeypatch.setattr(stream_client, "STATUS_WAIT_SECONDS", 0.01)  # this reader never sees the end

    async def scenario() -> None:
        client = make_client(f"127.0.0.1:{free_port()}", spooled(1))
        async with running(client.run):
            await until(lambda: len(calls) >= 3, "three sessions")
        assert all(c.writes[0].WhichOneof("msg") == "hello" for c in calls)

    with caplog.at_level(logging.WARNING, logger=LOG):
        asyncio.run(scenario())
    assert warning_lines(caplog)[0].endswith(
        ": stream ended: RPC already finished.; retry 1 in 0.0s (1 frames spooled)"
    )


# -- the Agent with a controller --------------------------------------------------------------


def sim_agent(tmp_path: Path, controller: str, interval: float) -> Agent:
    config = load(
        None,
        {
            "node": "n1",
            "source": "sim",
            "interval_seconds": interval,
            "sim": {"gpus": 2},
            "stream": {
                "controller": controller,
                "backoff_initial_seconds": 0.01,
                "backoff_max_seconds": 0.05,
            },
        },
    )
    sim = SimNode("n1", gpus=2)
    return Agent(config, sim, SimHost(sim), ModelledProbes(sim))


def test_agent_keeps_sampling_while_the_controller_is_down(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent = sim_agent(tmp_path, f"127.0.0.1:{free_port()}", interval=0.05)

    async def scenario() -> None:
        async with running(agent.run):
            await until(lambda: agent.seq >= 5, "five sampling cycles")
            assert agent.client is not None and not agent.client.connected
            assert agent.spool is not None
            assert held(agent.spool) == list(range(1, agent.seq + 1))  # every frame kept, in order
            assert agent.latest is not None and len(agent.latest.gpus) == 2

    with caplog.at_level(logging.WARNING, logger="gpufleet.agent"):
        asyncio.run(scenario())
    assert any(r.name == "gpufleet.agent.stream" and "UNAVAILABLE" in r.getMessage() for r in caplog.records)


def test_agent_answers_a_probe_command_and_sends_the_results_at_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        controller = FakeController()
        controller.on_hello = [pb.ControllerMessage(command=pb.Command(id="p1", run_probes=pb.RunProbes()))]
        async with serving(controller) as target:
            agent = sim_agent(tmp_path, target, interval=60.0)  # the next tick is a minute away

            def probe_frames() -> list[pb.TelemetryFrame]:
                return [m.frame for m in controller.of_kind("frame") if m.frame.probes]

            async with running(agent.run):
                await until(lambda: bool(probe_frames()), "a frame with probe results")
                await until(lambda: agent.spool is not None and len(agent.spool) == 0, "acks")
            (result,) = controller.of_kind("command_result")
            answer = result.command_result
            assert (answer.command_id, answer.ok, answer.error, answer.repeated) == ("p1", True, "", False)
            (started,) = controller.of_kind("command_started")  # before the answer: the state `running`
            assert started.command_started.command_id == "p1"
            (with_probes,) = probe_frames()
            # The first frame, if the results beat its sample, else the one right after it; never the
            # next tick's, a minute away. Which of the two is a race between threads.
            assert with_probes.seq in (1, 2)
            assert {p.probe for p in with_probes.probes} == {"gemm", "membw", "pcie", "nccl"}
            assert (answer.run_probes.results, answer.run_probes.failed) == (len(with_probes.probes), 0)
            hello_msg = controller.received(0)[0].hello
            assert hello_msg.boot_id == agent.boot_id == with_probes.boot_id

    asyncio.run(scenario())
