"""Commands across replicas (replica_ingest, controller/replicas.py), two controllers in one process
on one store (an SQLite file, a real PostgreSQL database): the leader issues a command for a node
that streams to the standby; the standby sends it on that stream, same id, and stores the answer;
the leader finishes it as stored. A command the leader gave up on is let go there."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest

from controller.app import ControllerApp
from controller.commands.channel import LATE_WATCH_SECONDS, CommandChannel
from controller.errors import FailedPrecondition
from controller.replicas import ReplicaFeed
from controller.store.commands import CommandRecord
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.harness import T0, Clock, frame, hello
from tests.controller.replica_apps import SYNC_SECONDS, leader_and_standby
from tests.controller.store.test_store import run


@dataclass
class Scene:
    leader: ControllerApp
    standby: ControllerApp
    outbox: asyncio.Queue[pb.ControllerMessage]  # n1's stream on the standby
    clock: Clock
    waiting: asyncio.Task[None]  # the standby's start(): done once it leads


Body = Callable[[Scene], Awaitable[None]]


def _with_replicas(db: str, body: Body) -> None:
    """A leader, and a standby (serving its agents) with n1 streaming to it, which the leader took in."""
    clock = Clock(T0)

    async def go() -> None:
        async with leader_and_standby(db, clock) as replicas:
            standby = replicas.standby
            outbox: asyncio.Queue[pb.ControllerMessage] = asyncio.Queue()
            await standby.ingest.hello(hello("n1"))
            standby.commands.open_stream(hello("n1"), outbox, "ipv4:10.0.0.9:4000")
            await standby.ingest.frame("n1", frame(1))
            assert await replicas.feed.take_in() == ["n1"]
            await body(Scene(replicas.leader, standby, outbox, clock, replicas.waiting))

    run(go())


def _feed(app: ControllerApp) -> ReplicaFeed:
    assert isinstance(app.replicas, ReplicaFeed)
    return app.replicas


async def _stored(channel: CommandChannel, command_id: str) -> CommandRecord:
    (row,) = await channel.store.commands_by_id([command_id])  # queued after its writes: committed
    return row


def test_the_standby_sends_the_leaders_command_and_the_leader_finishes_it_as_answered(store_db: str) -> None:
    async def body(scene: Scene) -> None:
        leader, standby, outbox = scene.leader, scene.standby, scene.outbox
        finished: list[str] = []
        leader.commands.listeners.append(lambda r: finished.append(f"{r.id} {r.state}"))
        assert leader.fleet.nodes["n1"].connected and leader.commands.reachable("n1")
        run_probes = pb.Command(run_probes=pb.RunProbes(probes=["gemm"]))
        record = await leader.commands.issue("n1", run_probes, "operator:alice")
        assert record.state == "pending" and leader.commands.delegated() == [record]

        assert await _feed(standby).deliver_commands() == 1
        sent = outbox.get_nowait().command
        assert sent.id == record.id and list(sent.run_probes.probes) == ["gemm"]
        assert await _feed(standby).deliver_commands() == 0  # once
        assert (await _stored(standby.commands, record.id)).state == "sent"
        assert await _feed(leader).settle_commands() == 0
        assert record.state == "sent" and record.boot_id == "b1" and finished == []

        standby.commands.started("n1", record.id)
        result = pb.CommandResult(command_id=record.id, ok=True, run_probes=pb.RunProbesResult(results=8))
        standby.commands.answered("n1", result)
        assert (await _stored(standby.commands, record.id)).state == "succeeded"
        assert await _feed(leader).settle_commands() == 1
        assert (
            record.state == "succeeded"
            and record.result is not None
            and record.result.run_probes.results == 8
        )
        assert finished == [f"{record.id} succeeded"] and leader.commands.delegated() == []

    _with_replicas(store_db, body)


def test_a_command_the_leader_gave_up_on_is_let_go_by_the_standby(store_db: str) -> None:
    async def body(scene: Scene) -> None:
        leader, standby = scene.leader, scene.standby
        record = await leader.commands.issue("n1", pb.Command(run_probes=pb.RunProbes()), "scheduler")
        assert await _feed(standby).deliver_commands() == 1
        assert record.id in standby.commands.open
        leader.commands.expire(record.deadline + 1)  # the leader's deadline passed first
        assert (await _stored(leader.commands, record.id)).state == "timed_out"
        await _feed(standby).deliver_commands()
        assert record.id not in standby.commands.open and not standby.commands.taken_up

    _with_replicas(store_db, body)


def test_a_standby_that_leads_on_its_agents_streams_finishes_what_it_took_up_and_sends_the_rest(
    store_db: str,
) -> None:
    """The standby takes the lead with n1's stream kept open (controller/server.py): the command it
    took up from the dead leader stays as it is, its own now, not sent again; the one the leader
    issued since, not taken up yet, goes on the stream at once; n1's node is the standby's own."""

    async def body(scene: Scene) -> None:
        leader, standby, outbox = scene.leader, scene.standby, scene.outbox
        taken = await leader.commands.issue("n1", pb.Command(run_probes=pb.RunProbes()), "operator:alice")
        assert await _feed(standby).deliver_commands() == 1
        assert outbox.get_nowait().command.id == taken.id
        later = await leader.commands.issue("n1", pb.Command(run_probes=pb.RunProbes()), "scheduler")
        held = standby.commands.open[taken.id]
        node = standby.fleet.nodes["n1"]
        standby.connected("n1")  # (the servicer's, for the stream opened above)
        standby.takeover.streams_kept = True
        leader.close()
        await asyncio.wait_for(scene.waiting, 20)
        assert standby.fleet.nodes["n1"] is node and node.connected
        assert standby.ingest.fleet is standby.fleet
        assert standby.commands.open[taken.id] is held and not standby.commands.taken_up
        sent = outbox.get_nowait().command
        assert sent.id == later.id and outbox.empty()
        assert standby.commands.open[later.id].state == "sent"
        result = pb.CommandResult(command_id=taken.id, ok=True, run_probes=pb.RunProbesResult(results=8))
        assert standby.commands.answered("n1", result) is held
        assert held.state == "succeeded" and (await _stored(standby.commands, taken.id)).state == "succeeded"

    _with_replicas(store_db, body)


def test_a_node_streaming_nowhere_is_refused_commands(store_db: str) -> None:
    async def body(scene: Scene) -> None:
        leader, clock = scene.leader, scene.clock
        clock.now += 3 * SYNC_SECONDS  # the standby stopped writing n1: its agent streams nowhere
        await _feed(leader).take_in()
        assert not leader.fleet.nodes["n1"].connected
        with pytest.raises(FailedPrecondition, match="node n1 is not connected"):
            await leader.commands.issue("n1", pb.Command(run_probes=pb.RunProbes()), "scheduler")

    _with_replicas(store_db, body)


def test_an_answer_after_the_leaders_deadline_is_taken_up_late_whichever_is_stored_first(
    store_db: str,
) -> None:
    async def body(scene: Scene) -> None:
        leader, standby = scene.leader, scene.standby
        run_probes = pb.Command(run_probes=pb.RunProbes(probes=["gemm"]))

        def answer(command_id: str, results: int) -> pb.CommandResult:
            return pb.CommandResult(
                command_id=command_id, ok=True, run_probes=pb.RunProbesResult(results=results)
            )

        # 1. The leader's deadline first: timed_out stored, the standby lets the command go; the
        # agent's answer then comes to the standby, which stores it as the real outcome, late.
        first = await leader.commands.issue("n1", run_probes, "operator:alice")
        assert await _feed(standby).deliver_commands() == 1
        leader.commands.expire(first.deadline + 1)
        assert first.state == "timed_out" and (await _stored(leader.commands, first.id)).state == "timed_out"
        await _feed(standby).deliver_commands()
        assert first.id not in standby.commands.open
        assert standby.commands.answered("n1", answer(first.id, 8)) is not None
        stored = await _stored(standby.commands, first.id)
        assert (
            stored.state == "succeeded" and stored.result is not None and "after its deadline" in stored.error
        )
        await _feed(leader).settle_commands()
        assert (
            first.state == "succeeded" and first.result is not None and first.result.run_probes.results == 8
        )
        assert first.error.count("answered after its deadline") == 1, first.error
        assert first.id not in leader.commands.late_elsewhere

        # 2. The standby's answer stored first, the leader's deadline before it reads it: the answer
        # stands in the store (timed_out is written only over an open row), and the leader takes it up.
        second = await leader.commands.issue("n1", run_probes, "operator:alice")
        assert await _feed(standby).deliver_commands() == 1
        assert standby.commands.answered("n1", answer(second.id, 4)) is not None
        assert (await _stored(standby.commands, second.id)).state == "succeeded"
        leader.commands.expire(second.deadline + 1)
        assert second.state == "timed_out"
        stored = await _stored(leader.commands, second.id)
        assert (
            stored.state == "succeeded"
            and stored.result is not None
            and stored.result.run_probes.results == 4
        )
        await _feed(leader).settle_commands()
        assert second.state == "succeeded" and second.result is not None
        assert second.error.startswith("answered after its deadline")
        assert leader.commands.delegated() == []

    _with_replicas(store_db, body)


def test_a_late_answer_is_looked_for_an_hour_past_the_deadline(store_db: str) -> None:
    async def body(scene: Scene) -> None:
        leader, clock = scene.leader, scene.clock
        record = await leader.commands.issue("n1", pb.Command(run_probes=pb.RunProbes()), "scheduler")
        leader.commands.expire(record.deadline + 1)
        assert leader.commands.delegated() == [record]  # its answer may still come from the standby
        clock.now = record.deadline + LATE_WATCH_SECONDS + 1
        assert leader.commands.delegated() == [] and not leader.commands.late_elsewhere

    _with_replicas(store_db, body)
