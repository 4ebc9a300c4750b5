"""On-connect probe runs obey probes.max_fleet_share: a fleet (re)connecting at once probes a share
at a time, in connect order, each finished run handing its slot to the next waiting node (real gRPC
streams on 127.0.0.1, scripted agents)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Collection

from controller.config import ProbeConfig
from controller.fleet.silencing import Maintenance
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.harness import config, running_controller
from tests.controller.test_probe_node import AgentCall, next_command, scripted_agent, until

NODES = ["n1", "n2", "n3", "n4"]


def storm_config() -> ProbeConfig:
    # 0.25 of 4 connected nodes: one node probes at a time (at least one, always).
    return ProbeConfig(on_connect=True, periodic=False, max_fleet_share=0.25)


def done(in_flight: Collection[str], name: str) -> bool:
    return name not in in_flight


async def answer(call: AgentCall, command: pb.Command) -> None:
    await call.write(pb.AgentMessage(command_result=pb.CommandResult(command_id=command.id, ok=True)))


def test_a_fleet_connecting_at_once_probes_one_share_at_a_time_in_connect_order() -> None:
    async def go() -> None:
        async with running_controller(config(probes=storm_config())) as running:
            probing = running.app.probing
            async with contextlib.AsyncExitStack() as stack:
                calls = {}
                for name in NODES:
                    calls[name] = await stack.enter_async_context(scripted_agent(running, name))
                await until(lambda: list(probing.waiting) == ["n2", "n3", "n4"], "three waiting")
                assert set(probing.commands.in_flight) == {"n1"}
                order = []
                for name in NODES:  # each answer frees the slot for the next node, at once
                    command = await next_command(calls[name])
                    assert command.HasField("run_probes")
                    order.append(name)
                    assert set(probing.commands.in_flight) == {name}
                    await answer(calls[name], command)
                    await until(functools.partial(done, probing.commands.in_flight, name), f"{name} answered")
                assert order == NODES and not probing.waiting
                assert probing.commands.sent["on_connect"] == 4

    asyncio.run(go())


def test_a_waiting_node_that_leaves_or_goes_under_maintenance_is_skipped() -> None:
    async def go() -> None:
        async with running_controller(config(probes=storm_config())) as running:
            probing = running.app.probing
            async with contextlib.AsyncExitStack() as stack:
                first = await stack.enter_async_context(scripted_agent(running, "n1"))
                async with scripted_agent(running, "n2"):
                    await until(lambda: list(probing.waiting) == ["n2"], "n2 waiting")
                await until(lambda: not running.app.fleet.nodes["n2"].connected, "n2 gone")
                third = await stack.enter_async_context(scripted_agent(running, "n3"))
                running.app.silencing.maintenance["n3"] = Maintenance("n3", "alice", "PSU swap", 0.0)
                fourth = await stack.enter_async_context(scripted_agent(running, "n4"))
                await until(lambda: list(probing.waiting) == ["n2", "n3", "n4"], "three waiting")
                await answer(first, await next_command(first))
                command = await next_command(fourth)  # n2 left, n3 is under maintenance: n4 is next
                assert set(probing.commands.in_flight) == {"n4"} and not probing.waiting
                await answer(fourth, command)
                with contextlib.suppress(TimeoutError):
                    msg = await asyncio.wait_for(third.read(), 0.5)
                    assert not (isinstance(msg, pb.ControllerMessage) and msg.WhichOneof("msg") == "command")

    asyncio.run(go())


def test_slots_follow_the_connected_fleet() -> None:
    async def go() -> None:
        probes = ProbeConfig(on_connect=True, periodic=False, max_fleet_share=0.5)
        async with running_controller(config(probes=probes)) as running:
            probing = running.app.probing
            async with contextlib.AsyncExitStack() as stack:
                for name in NODES:
                    await stack.enter_async_context(scripted_agent(running, name))
                # 1 connected: 1 slot (n1); 2: still 1 (n2 waits); 3: 1; 4: 2 -> n2 starts.
                await until(lambda: set(probing.commands.in_flight) == {"n1", "n2"}, "two probing")
                assert list(probing.waiting) == ["n3", "n4"]
                assert probing.slots_left() == 0

    asyncio.run(go())
