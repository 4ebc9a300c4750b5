"""Agents spread over replicas (replica_ingest, controller/replicas.py), two controllers in one
process on one store (an SQLite file, a real PostgreSQL database): a standby ingests the agents that
connect to it; the leader takes its nodes in; an agent that moves takes its node along, from the
stored position, and the replica it left can write nothing more of it."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from prometheus_client import generate_latest

from controller.app import ControllerApp
from controller.errors import NotOwner
from controller.metrics import controller_registry
from tests.controller.harness import T0, Clock, config, frame, hello
from tests.controller.replica_apps import SYNC_SECONDS, leader_and_standby
from tests.controller.store.test_store import run


async def _three_frames(standby: ControllerApp) -> None:
    """n1's Hello and frames 1..3 on the standby, an XID in frame 2; its readings then written."""
    assert await standby.ingest.hello(hello("n1")) == 0
    for seq in (1, 2, 3):
        sent = frame(seq)
        if seq == 2:  # between two writes of its readings: written with the next
            sent.gpus[0].xid_events.add(code=79, unix_time_seconds=T0 - 8)
        assert await standby.ingest.frame("n1", sent) == seq
    await standby.ingest.flush_state()


def test_a_standby_ingests_the_leader_takes_its_nodes_in_and_an_agent_that_moves_takes_its_node_along(
    store_db: str,
) -> None:
    clock = Clock(T0)

    async def go() -> None:
        async with leader_and_standby(store_db, clock, detection=True) as replicas:
            leader, standby, feed = replicas.leader, replicas.standby, replicas.feed
            assert standby.ingest.state_every_seconds == SYNC_SECONDS  # stored for the leader to see

            await _three_frames(standby)
            assert "n1" not in leader.fleet.nodes
            clock.now += 1
            assert await feed.take_in() == ["n1"]
            seen = leader.fleet.nodes["n1"]
            assert seen.gpus[0].sample.power_watts == 403.0 and leader.fleet.acked[("n1", "b1")] == 3
            assert leader.fleet.probes[("n1", 0, "gemm", "bf16")].value == 703.0
            assert [(x.gpu, x.code) for x in seen.trends.xids] == [(0, 79)]  # frame 2's, not lost
            assert seen.connected and "n1" not in leader.connections  # streams to the standby
            page = generate_latest(controller_registry(leader)).decode()
            assert "gpufleet_controller_replica_nodes_elsewhere 1.0" in page
            assert "gpufleet_controller_replica_nodes_taken_in_total 1.0" in page
            report = await leader.detection_pass()  # in the detection process: the XID reached it
            assert [(f.node, f.cause) for f in report.findings] == [("n1", "xid_error")]
            clock.now += 3 * SYNC_SECONDS
            assert await feed.take_in() == []  # read again within the margin, not rewritten: not loaded
            assert not seen.connected  # not written for three syncs: not streaming anywhere

            # Its agent reconnects to the leader: from the position the standby stored.
            assert await leader.ingest.hello(hello("n1")) == 3
            assert await leader.ingest.frame("n1", frame(4)) == 4
            with pytest.raises(NotOwner, match="node n1 is ingested by replica"):
                await standby.ingest.frame("n1", frame(4))
            assert standby.fleet.acked[("n1", "b1")] == 3  # nothing applied either
            assert await feed.take_in() == []  # the leader's own node now
            assert leader.ingest.counters.taken_over == 1 and feed.elsewhere_streaming() == 0

            leader.close()  # the standby leads now, with the store as the leader left it
            await asyncio.wait_for(replicas.waiting, 20)
            assert standby.ingest.state_every_seconds == standby.config.db_state_seconds
            assert standby.replicas is not None
            await standby.replicas.catch_up()  # (a warm standby's: the leader's node since its last look)
            assert standby.fleet.acked[("n1", "b1")] == 4

    run(go())


def test_a_hello_on_a_replica_takes_its_node_in_one_turn_of_the_store_thread(store_db: str) -> None:
    """Claim, the stored rows and the Hello in one job: when a dead replica's agents all move at
    once, each Hello waited its turn in the store thread's queue three times (claim, load, Hello)
    behind their first frames (2,000 nodes on two replicas: their Hellos done 20 s after the kill)."""
    clock = Clock(T0)

    async def go() -> None:
        async with leader_and_standby(store_db, clock) as replicas:
            leader, standby = replicas.leader, replicas.standby
            await _three_frames(standby)
            submit, jobs = leader.store._thread.submit, []

            def counted(fn: Any, **kwargs: Any) -> Any:
                jobs.append(asyncio.current_task())
                return submit(fn, **kwargs)

            leader.store._thread.submit = counted  # type: ignore[method-assign]
            for _ in range(2):  # taken over from the standby; then its own already
                hello_task = asyncio.create_task(leader.ingest.hello(hello("n1")))
                assert await hello_task == 3
                assert jobs.count(hello_task) == 1, jobs
            assert leader.ingest.counters.taken_over == 1
            assert leader.fleet.nodes["n1"].gpus[0].sample.power_watts == 403.0  # the standby's rows
            with pytest.raises(NotOwner):
                await standby.ingest.frame("n1", frame(4))

    run(go())


def test_the_leaders_looks_are_not_queued_behind_its_own_agents_writes(store_db: str) -> None:
    """Its periodic take-in reads on a connection of its own: with its store thread held up (its
    agents' frames), it still takes in what the standby stored, and the writes go on after. In the
    queue each chunk of 250 nodes held every ack of the leader for 0.3-0.5 s (2,000 nodes on two
    replicas, PostgreSQL, 2 cores)."""
    clock = Clock(T0)

    async def go() -> None:
        async with leader_and_standby(store_db, clock) as replicas:
            leader, feed = replicas.leader, replicas.feed
            await _three_frames(replicas.standby)
            clock.now += 1
            release, stop = threading.Event(), asyncio.Event()
            held = leader.store._thread.submit(lambda _: release.wait(20))
            feed.due = True  # its first look at once
            looking = asyncio.create_task(feed.run_forever(stop))
            try:
                for _ in range(200):
                    if "n1" in leader.fleet.nodes:
                        break
                    await asyncio.sleep(0.05)
                assert leader.fleet.acked.get(("n1", "b1")) == 3
                assert not held.done()  # the store thread was held all along
            finally:
                release.set()
                stop.set()
            await looking
            assert await held

    run(go())


def test_replica_ingest_needs_a_store_the_replicas_share() -> None:
    with pytest.raises(ValueError, match="replica_ingest needs a store the replicas share"):
        config(replica_ingest=True)
    with pytest.raises(ValueError, match="replica_sync_seconds"):
        config(db="x.db", replica_sync_seconds=0.5)


def test_the_leader_loads_only_probe_results_newer_than_it_holds(store_db: str) -> None:
    """A node's probe results rarely change between two looks: each look reads the readings again,
    and only the results newer than the leader holds (they were most of a node's bytes)."""
    clock = Clock(T0)

    async def go() -> None:
        async with leader_and_standby(store_db, clock, detection=True) as replicas:
            leader, standby, feed = replicas.leader, replicas.standby, replicas.feed
            loaded: list[list[tuple[str, int, str, str]]] = []
            load = leader.store.load_nodes

            async def recorded(names: list[str], held: object = None, *, apart: bool = False) -> object:
                rows = await load(names, held, apart=apart)  # type: ignore[arg-type]
                loaded.append([(n, g, p, v) for n, g, p, v, *_ in rows.probes])
                return rows

            leader.store.load_nodes = recorded  # type: ignore[method-assign,assignment]
            await _three_frames(standby)
            clock.now += 1
            assert await feed.take_in() == ["n1"]
            assert loaded[-1] == [("n1", 0, "gemm", "bf16")]
            held = leader.fleet.probes[("n1", 0, "gemm", "bf16")]

            later = frame(4)
            del later.probes[:]  # new readings, no new probe result
            later.gpus[0].power_watts = 450.0
            assert await standby.ingest.frame("n1", later) == 4
            await standby.ingest.flush_state()
            clock.now += 1
            assert await feed.take_in() == ["n1"]
            assert loaded[-1] == []  # the result held was not read again
            assert leader.fleet.nodes["n1"].gpus[0].sample.power_watts == 450.0
            assert leader.fleet.probes[("n1", 0, "gemm", "bf16")] is held

            newer = frame(5)
            newer.probes.add(probe="membw", variant="stream", gpu=1, value=3.1, unit="TB/s")
            assert await standby.ingest.frame("n1", newer) == 5
            await standby.ingest.flush_state()
            clock.now += 1
            assert await feed.take_in() == ["n1"]
            assert sorted(loaded[-1]) == [("n1", 0, "gemm", "bf16"), ("n1", 1, "membw", "stream")]
            assert leader.fleet.probes[("n1", 0, "gemm", "bf16")].value == 705.0
            report = await leader.detection_pass()  # the detection copy took the same rows in
            assert report is not None

    run(go())


def test_a_node_the_leader_takes_in_comes_with_its_probe_history(store_db: str) -> None:
    """A look takes in each key's newest result; a node the leader first sees through the store
    (its agent streamed to a standby from its first frame), and a key probed more than once between
    two looks, get their history as stored, in the leader's fleet and in its detection copy: the
    detectors judge a GPU against its own history."""
    clock = Clock(T0)
    key = ("n1", 0, "gemm", "bf16")

    async def go() -> None:
        async with leader_and_standby(store_db, clock, detection=True) as replicas:
            leader, standby, feed = replicas.leader, replicas.standby, replicas.feed
            assert leader.detection is not None
            sent: list[dict[Any, Any]] = []
            send = leader.detection.history

            def recorded(history: Any) -> None:
                sent.append({k: list(series) for k, series in history.items()})
                send(history)

            leader.detection.history = recorded  # type: ignore[method-assign]
            await _three_frames(standby)  # gemm 701, 702, 703
            clock.now += 1
            assert await feed.take_in() == ["n1"]
            assert [v for _, v in leader.fleet.history[key]] == [701.0, 702.0, 703.0]
            assert [[v for _, v in points] for points in sent[-1].values()] == [[701.0, 702.0, 703.0]]

            for seq in (4, 5):  # two results between two looks
                assert await standby.ingest.frame("n1", frame(seq)) == seq
            await standby.ingest.flush_state()
            clock.now += 1
            assert await feed.take_in() == ["n1"]
            assert [v for _, v in leader.fleet.history[key]] == [701.0, 702.0, 703.0, 704.0, 705.0]
            assert [v for _, v in sent[-1][key]] == [701.0, 702.0, 703.0, 704.0, 705.0]

            later = frame(6)
            del later.probes[:]  # readings only: no history read
            assert await standby.ingest.frame("n1", later) == 6
            await standby.ingest.flush_state()
            clock.now += 1
            count = len(sent)
            assert await feed.take_in() == ["n1"]
            assert len(sent) == count
            report = await leader.detection_pass()  # the copy took it all in
            assert report is not None

    run(go())
