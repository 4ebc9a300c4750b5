"""Ingest fronts (controller/fronts/) with real front processes: agents' streams spread over them,
commands reach each node through the front that holds its stream and answers come back, a front
that dies is started again while its agents reconnect, operators are sent to their own port, and a
node's certificate is checked on what the front's TLS saw. (Every case of test_servicer.py also runs
through fronts.)"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import generate_latest

from controller import event_loop
from controller.config import ProbeConfig
from controller.fronts.relay import Fronts
from controller.fronts.wire import FrontSettings
from controller.metrics import controller_registry
from controller.server import server_options
from controller.servicer import TelemetryServicer
from protos.gpufleet.v1 import operator_pb2, operator_pb2_grpc, telemetry_pb2_grpc
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.harness import Running, as_frame, as_hello, config, frame, hello, running_controller
from tests.controller.loops import FORKS, LOOPS, pipe_capacity
from tests.security.tls_files import Pki, Refused, controller_config, stream_one_frame, tls_controller

TIMEOUT = 10.0
# Channels in one process share a connection unless told not to; each agent has its own.
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]
AgentCall = grpc.aio.StreamStreamCall[pb.AgentMessage, pb.ControllerMessage]


async def until(condition: Any, what: str, timeout: float = TIMEOUT) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def next_message(call: AgentCall, kind: str) -> pb.ControllerMessage:
    while True:
        message = await asyncio.wait_for(call.read(), TIMEOUT)
        assert isinstance(message, pb.ControllerMessage), message
        if message.WhichOneof("msg") == kind:
            return message


@contextlib.asynccontextmanager
async def agents(running: Running, names: list[str]) -> AsyncIterator[dict[str, AgentCall]]:
    """One connection per node, each with its Hello and first frame acked."""
    async with contextlib.AsyncExitStack() as stack:
        calls: dict[str, AgentCall] = {}
        for name in names:
            own = grpc.aio.insecure_channel(running.address, options=OWN_CONNECTION)
            channel = await stack.enter_async_context(own)
            call = telemetry_pb2_grpc.TelemetryStub(channel).Stream(None)
            capable = hello(name, capabilities=["run_probes"], probes=["gemm"])
            await call.write(as_hello(capable))
            await call.write(as_frame(frame(1, name)))
            assert (await next_message(call, "ack")).ack.seq == 1
            calls[name] = call
        yield calls
        for call in calls.values():
            call.cancel()


def scrape(running: Running) -> dict[str, float]:
    """The controller's /metrics page as it would be served: series -> value."""
    page = generate_latest(controller_registry(running.app)).decode()
    return {
        line.rpartition(" ")[0]: float(line.rpartition(" ")[2])
        for line in page.splitlines()
        if line and not line.startswith("#")
    }


def held_by(fronts: Fronts) -> list[int]:
    return [len(front.streams) for front in fronts.running]


@pytest.mark.parametrize("loop", LOOPS)
def test_streams_spread_over_fronts_and_commands_and_answers_go_through_each_ones_front(loop: str) -> None:
    names = [f"n{i:02d}" for i in range(24)]

    async def go() -> None:
        cfg = config(probes=ProbeConfig(on_connect=False))
        forks = len(FORKS)
        async with running_controller(cfg, fronts=2) as running, agents(running, names) as calls:
            assert running.fronts is not None
            assert sum(held_by(running.fronts)) == len(names)
            assert min(held_by(running.fronts)) > 0, held_by(running.fronts)  # the kernel spread them
            assert running.app.connected_agents == len(names)
            wide = pipe_capacity()
            assert all(front.pipe_bytes == (wide, wide) for front in running.fronts.running)
            async with grpc.aio.insecure_channel(running.operators) as channel:
                operators = operator_pb2_grpc.OperatorStub(channel)
                for name, call in calls.items():
                    asked = await operators.ProbeNode(operator_pb2.ProbeNodeRequest(node=name))
                    command = (await next_message(call, "command")).command
                    assert command.id == asked.command_id, name  # on this node's stream, through its front
                    result = pb.CommandResult(command_id=command.id, ok=name != "n05")
                    await call.write(pb.AgentMessage(command_result=result))
                    await call.write(as_frame(frame(2, name)))
                    assert (await next_message(call, "ack")).ack.seq == 2
                    record = running.app.commands.get(command.id)
                    assert record is not None and record.node == name
                    assert record.state == ("failed" if name == "n05" else "succeeded"), name
            assert running.app.fleet.acked[("n07", "b1")] == 2
        assert len(FORKS) == forks  # the fronts started without a fork's handlers (controller/children.py)

    event_loop.run(go(), loop)


def test_a_front_that_dies_is_started_again_and_its_agents_reconnect_to_the_fronts() -> None:
    names = [f"n{i:02d}" for i in range(16)]

    async def go() -> None:
        async with running_controller(config(), fronts=2) as running, agents(running, names) as calls:
            fronts = running.fronts
            assert fronts is not None
            doomed = fronts.running[0]
            lost = {sid for sid in doomed.streams}
            assert lost
            assert doomed.transport is not None
            os.kill(doomed.transport.get_pid(), signal.SIGKILL)
            await until(lambda: fronts.restarts == 1 and fronts.running[0] is not doomed, "the restart")
            await until(lambda: running.app.connected_agents == len(names) - len(lost), "disconnects")
            cut = [name for name in names if not running.app.fleet.nodes[name].connected]
            assert len(cut) == len(lost)
            for name in cut:  # the agent sees its stream fail, and reconnects
                with pytest.raises(grpc.aio.AioRpcError) as failed:
                    await next_message(calls[name], "ack")
                assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
            async with agents(running, [f"{name}-again" for name in cut]):
                assert running.app.connected_agents == len(names)
            for name in sorted(set(names) - set(cut)):  # the other front's agents never noticed
                await calls[name].write(as_frame(frame(2, name)))
                assert (await next_message(calls[name], "ack")).ack.seq == 2
                await until(lambda: fronts.running[0].alive, "the new front to listen")
                scraped = scrape(running)
                assert scraped["gpufleet_controller_ingest_fronts"] == 2
                assert scraped["gpufleet_controller_ingest_front_restarts_total"] == 1
                series = 'gpufleet_controller_ingest_front_streams{{front="{}"}}'
                streams = [scraped[series.format(i)] for i in (0, 1)]
                assert sum(streams) == running.app.connected_agents == len(names) - len(cut)

    asyncio.run(go())


def test_each_fronts_open_files_are_shown_with_the_controllers() -> None:
    """gpufleet_controller_open_files counts each front's files, a file per agent's connection among
    them, besides the controller's own; the limit is the controller's, which the fronts inherit."""
    names = [f"n{i:02d}" for i in range(24)]

    def front_files(scraped: dict[str, float], index: int) -> float:
        return scraped[f'gpufleet_controller_open_files{{process="front-{index}"}}']

    async def go() -> None:
        async with running_controller(config(), fronts=2) as running:
            fronts = running.fronts
            assert fronts is not None
            await until(lambda: all(front.alive for front in fronts.running), "the fronts to listen")
            before = scrape(running)
            async with agents(running, names):
                after = scrape(running)
                for front in fronts.running:
                    assert front.pid is not None
                    assert (
                        abs(front_files(after, front.index) - len(os.listdir(f"/proc/{front.pid}/fd"))) <= 2
                    )
                    grew = front_files(after, front.index) - front_files(before, front.index)
                    assert len(front.streams) <= grew <= len(front.streams) + 2, (grew, len(front.streams))
                assert sum(len(front.streams) for front in fronts.running) == len(names)
                own = after['gpufleet_controller_open_files{process="controller"}']
                assert abs(own - len(os.listdir("/proc/self/fd"))) <= 2
                limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
                assert after["gpufleet_controller_open_files_limit"] == limit

    asyncio.run(go())


def test_operators_on_the_agents_port_are_told_to_use_theirs() -> None:
    async def go() -> None:
        async with (
            running_controller(config(), fronts=1) as running,
            grpc.aio.insecure_channel(running.address) as channel,
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await operator_pb2_grpc.OperatorStub(channel).ListNodes(operator_pb2.ListNodesRequest())
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            details = refused.value.details() or ""
            assert "operator_listen" in details and details.endswith(f", {running.operators}")

    asyncio.run(go())


def test_a_nodes_certificate_is_checked_on_what_the_fronts_tls_saw(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    files = pki.server()

    async def go() -> None:
        async with tls_controller(controller_config(files)) as running:
            settings = FrontSettings("127.0.0.1:0", server_options(running.app.config), files.config())
            fronts = Fronts(TelemetryServicer(running.app), 2, settings)
            address = await fronts.start()
            try:
                with pytest.raises(Refused) as refused:
                    await stream_one_frame(address, pki.client("n1"), hello("n2"), frame(1, "n2"))
                assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
                assert "n2" in refused.value.details and "n1" in refused.value.details
                assert "n2" not in running.app.fleet.nodes
                acked = await stream_one_frame(address, pki.client("n1"), hello("n1"), frame(1, "n1"))
                assert acked.ack.seq == 1
                assert running.app.identity.transports["n1"] == "mtls"
            finally:
                await fronts.stop()

    asyncio.run(go())


@pytest.mark.parametrize("loop", LOOPS)
def test_a_controller_behind_its_agents_holds_a_bounded_backlog_and_loses_nothing(loop: str) -> None:
    """Ingest stalls: past high_water bytes waiting, the controller stops reading the front's pipe
    (its backlog stays bounded) and takes it up again once ingest catches up; every frame is acked,
    in order."""
    frames, high_water = 60, 4000

    async def go() -> None:
        async with running_controller(config()) as running:
            app = running.app
            gate = asyncio.Event()
            ingest_frame = app.ingest.frame
            peak = [0]

            async def stalled(node: str, f: pb.TelemetryFrame, *rest: Any) -> int:
                peak[0] = max(peak[0], front.queued)
                await gate.wait()
                return await ingest_frame(node, f, *rest)

            app.ingest.frame = stalled  # type: ignore[method-assign,assignment]
            settings = FrontSettings("127.0.0.1:0", server_options(app.config), None, high_water=4096)
            fronts = Fronts(TelemetryServicer(app), 1, settings, high_water=high_water)
            address = await fronts.start()
            front = fronts.running[0]
            try:
                async with grpc.aio.insecure_channel(address, options=OWN_CONNECTION) as channel:
                    call = telemetry_pb2_grpc.TelemetryStub(channel).Stream(None)
                    await call.write(as_hello(hello("n1")))
                    for seq in range(1, frames + 1):
                        await call.write(as_frame(frame(seq, "n1")))
                    await until(lambda: front.paused, "the pipe to pause")
                    await asyncio.sleep(0.3)  # the front goes on sending: the pipe stays unread
                    largest = len(as_frame(frame(frames, "n1")).SerializeToString())
                    assert front.queued <= high_water + largest
                    gate.set()
                    acks = [(await next_message(call, "ack")).ack.seq for _ in range(frames)]
                    assert acks == list(range(1, frames + 1))
                    assert not front.paused and front.pauses >= 1 and front.queued == 0
                    assert app.fleet.acked[("n1", "b1")] == frames
                    call.cancel()
            finally:
                await fronts.stop()
            assert peak[0] <= high_water + largest

    event_loop.run(go(), loop)
