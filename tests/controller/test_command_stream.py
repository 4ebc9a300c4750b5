"""The command channel over real gRPC: one stream per node (the newest), and a command in flight
across a controller restart is sent again with the same id and run once by the real agent."""

from __future__ import annotations

import asyncio
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
from controller.store.sqlite import Store
from protos.gpufleet.v1 import operator_pb2, operator_pb2_grpc
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.harness import config, running_controller
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
                assert probes.runs == [command_id]
            # The controller is gone with the run in progress; a new one takes over the same store.
            async with running_controller(cfg, clock=time.time) as second:
                again = second.app.commands.get(command_id)
                assert again is not None and again.requester.startswith("operator:ipv4:127.0.0.1:")
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
