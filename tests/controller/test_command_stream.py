"""The command channel over real gRPC: one stream per node (the newest), and a command in flight
across a controller restart is sent again with the same id and run once by the real agent."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest

from agent.config import load
from agent.daemon import Agent
from agent.probes.base import ProbeOutcome
from agent.sources.sim import SimNode
from agent.sources.sim.host import SimHost
from agent.sources.sim.probes import ModelledProbes
from controller.config import ProbeConfig
from controller.servicer import EOF
from controller.store.store import Store
from protos.gpufleet.v1 import operator_pb2, operator_pb2_grpc
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.harness import config, hello, running_controller
from tests.controller.test_probe_node import (
    TIMEOUT,
    agents_running,
    controller,
    next_command,
    scripted_agent,
    until,
)
from tests.support import free_port


def test_a_second_stream_for_a_node_replaces_the_first_which_is_closed_with_aborted() -> None:
    async def go() -> None:
        async with controller() as (running, stub), scripted_agent(running, "n1") as old:
            async with scripted_agent(running, "n1") as new:
                code = await asyncio.wait_for(old.code(), TIMEOUT)
                details = await old.details()
                assert code == grpc.StatusCode.ABORTED
                assert details.startswith("replaced by a newer stream for node n1 from ipv4:127.0.0.1:")
                assert running.app.fleet.nodes["n1"].connected and running.app.connected_agents == 1
                sent = await stub.ProbeNode(operator_pb2.ProbeNodeRequest(node="n1"))
                assert (await next_command(new)).id == sent.command_id  # the newest stream gets it
            await until(lambda: not running.app.fleet.nodes["n1"].connected, "the last stream gone")

    asyncio.run(go())


def test_streams_replaced_as_a_partition_heals_are_logged_a_few_then_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every node's agent reconnects while the controller still holds its old stream: a warning each
    up to the window's budget (1 here), the others counted in one warning, at shutdown at the latest."""
    caplog.set_level(logging.WARNING, STREAM_LOG)
    nodes = ["n1", "n2", "n3"]

    async def go() -> None:
        async with controller() as (running, _), contextlib.AsyncExitStack() as stack:
            running.app.connection_log.per_window = 1
            olds = [await stack.enter_async_context(scripted_agent(running, n)) for n in nodes]
            for node, old in zip(nodes, olds, strict=True):
                await stack.enter_async_context(scripted_agent(running, node))
                assert await asyncio.wait_for(old.code(), TIMEOUT) == grpc.StatusCode.ABORTED
            assert len(stream_warnings(caplog)) == 1

    asyncio.run(go())
    first, count = stream_warnings(caplog)
    # (the test's channels share one connection: both peers may be the same address)
    assert re.fullmatch(r"node n1: stream from ipv4:127\.0\.0\.1:\d+ replaced by a newer one from \S+", first)
    assert re.fullmatch(
        r"streams replaced: 2 more in the last 10 s, not logged one by one; the last: node n3: stream "
        r"from ipv4:127\.0\.0\.1:\d+ replaced by a newer one from ipv4:127\.0\.0\.1:\d+",
        count,
    ), count


STREAM_LOG = "gpufleet.controller.stream"


def stream_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == STREAM_LOG and r.levelno >= logging.WARNING]


def test_a_replaced_stream_sends_nothing_more_even_what_was_queued_as_it_was_replaced() -> None:
    """A command queued on the old stream in the same loop turn as its replacement goes on the new
    stream only: the old one is closed without it (else two agents of that name might both run it)."""

    async def go() -> None:
        async with controller() as (running, _), scripted_agent(running, "n1") as old:
            channel = running.app.commands
            queued = pb.ControllerMessage(command=pb.Command(id="c-race", run_probes=pb.RunProbes()))
            channel.streams["n1"].outbox.put_nowait(queued)  # no await between these two lines
            channel.open_stream(hello("n1"), asyncio.Queue(), "peer-newer")
            got = []
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                while (msg := await asyncio.wait_for(old.read(), TIMEOUT)) != EOF:
                    assert isinstance(msg, pb.ControllerMessage)
                    got.append(msg.WhichOneof("msg"))
            assert ended.value.code() == grpc.StatusCode.ABORTED
            assert "command" not in got

    asyncio.run(go())


class GatedProbes(ModelledProbes):
    """Modelled probes that hold each run until `gate` opens, and count the runs."""

    def __init__(self, node: SimNode) -> None:
        super().__init__(node)
        self.gate = threading.Event()
        self.runs: list[str] = []

    def run(
        self,
        probes: Sequence[str],
        *,
        force: bool = False,
        gpus: Sequence[int] | None = None,
        suite: str = "short",
        command_id: str = "",
    ) -> list[ProbeOutcome]:
        self.runs.append(command_id)
        assert self.gate.wait(timeout=30), "the test never opened the gate"
        return super().run(probes, force=force, gpus=gpus, suite=suite, command_id=command_id)

    def close(self) -> None:
        self.gate.set()


def test_a_command_in_flight_across_a_controller_restart_is_sent_again_and_run_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    address = f"127.0.0.1:{free_port()}"
    db = tmp_path / "controller.db"
    cfg = config(listen=address, db=str(db), probes=ProbeConfig(on_connect=False, periodic=False))
    agent_cfg = load(
        None,
        {
            "node": "n1",
            "source": "sim",
            "interval_seconds": 0.2,
            "sim": {"gpus": 2},
            "stream": {"controller": address, "backoff_initial_seconds": 0.05, "backoff_max_seconds": 0.2},
            "metrics": {"address": None},
        },
    )
    sim = SimNode("n1", gpus=2)
    probes = GatedProbes(sim)
    agent = Agent(agent_cfg, sim, SimHost(sim), probes)
    received: list[str] = []
    handle = agent.handle_command

    async def counting(command: pb.Command) -> pb.CommandResult:
        received.append(command.id)
        return await handle(command)

    monkeypatch.setattr(agent, "handle_command", counting)

    async def go() -> None:
        async with agents_running(agent):
            async with running_controller(cfg, clock=time.time) as first:
                await until(lambda: first.app.commands.reachable("n1"), "the agent")
                async with grpc.aio.insecure_channel(address) as channel:
                    stub = operator_pb2_grpc.OperatorStub(channel)
                    request = operator_pb2.ProbeNodeRequest(node="n1", probes=["gemm"], gpus=[0])
                    command_id = (await stub.ProbeNode(request, timeout=TIMEOUT)).command_id
                record = first.app.commands.get(command_id)
                assert record is not None
                await until(lambda: record.state == "running", "the agent to start the run")
                # `running` is said as the handler starts; the probe runner is called just after.
                await until(lambda: probes.runs == [command_id], "the probe runner to be called")
            # The controller is gone with the run in progress; a new one takes over the same store.
            async with running_controller(cfg, clock=time.time) as second:
                again = second.app.commands.get(command_id)
                assert again is not None and again.requester.startswith("anonymous from ipv4:127.0.0.1:")
                assert second.app.probing.commands.in_flight["n1"].id == command_id  # still busy probing
                await until(lambda: received == [command_id, command_id], "the same id sent again")
                probes.gate.set()
                await until(lambda: again.state == "succeeded", "the answer")
                assert again.result is not None and again.result.run_probes.results > 0
                assert "n1" not in second.app.probing.commands.in_flight
        assert probes.runs == [command_id]  # run once, though the agent was sent it twice
        store = Store(str(db))
        await store.open()
        try:
            (row,) = await store.list_commands("n1")
        finally:
            store.close()
        assert (row.id, row.state, row.error) == (command_id, "succeeded", "")

    asyncio.run(go())


def test_a_restarted_agent_with_command_memory_is_asked_again_and_answers_from_its_disk(
    tmp_path: Path,
) -> None:
    """The agent stops mid-run; its next boot (same spool dir, so `command_memory`) is sent the same
    id and answers it from disk as interrupted: failed for what it is, not failed blind, not rerun."""
    address = f"127.0.0.1:{free_port()}"
    cfg = config(listen=address, probes=ProbeConfig(on_connect=False, periodic=False))
    agent_cfg = load(
        None,
        {
            "node": "n1",
            "source": "sim",
            "interval_seconds": 0.2,
            "sim": {"gpus": 2},
            "stream": {
                "controller": address,
                "backoff_initial_seconds": 0.05,
                "backoff_max_seconds": 0.2,
                "spool_dir": str(tmp_path / "spool"),
            },
            "metrics": {"address": None},
        },
    )
    sim = SimNode("n1", gpus=2)
    first_probes, second_probes = GatedProbes(sim), GatedProbes(sim)
    first = Agent(agent_cfg, sim, SimHost(sim), first_probes)
    second = Agent(agent_cfg, sim, SimHost(sim), second_probes)
    assert "command_memory" in first.hello().capabilities and first.boot_id != second.boot_id

    async def go() -> None:
        async with running_controller(cfg, clock=time.time) as running:
            async with agents_running(first):
                await until(lambda: running.app.commands.reachable("n1"), "the agent")
                async with grpc.aio.insecure_channel(address) as channel:
                    stub = operator_pb2_grpc.OperatorStub(channel)
                    request = operator_pb2.ProbeNodeRequest(node="n1", probes=["gemm"], gpus=[0])
                    command_id = (await stub.ProbeNode(request, timeout=TIMEOUT)).command_id
                record = running.app.commands.get(command_id)
                assert record is not None
                await until(lambda: record.state == "running", "the agent to start the run")
                await until(lambda: first_probes.runs == [command_id], "the probe runner to be called")
            first_probes.gate.set()  # (the stopped agent's worker thread may end now)
            async with agents_running(second):
                await until(lambda: record.state == "failed", "the new boot's answer")
            assert record.boot_id == second.boot_id and record.failure == "error"
            assert record.result is not None and record.result.repeated
            assert record.error.startswith("interrupted")
            assert running.app.probing.commands.failed[("operator", "restarted")] == 0
        assert first_probes.runs == [command_id] and second_probes.runs == []  # not run again

    asyncio.run(go())
