"""A warm standby (controller/warm_standby.py): with replica_ingest, a standby loads the store while it
waits and keeps up with what every replica writes, and leads with that fleet without loading the store
again; the fleet it leads with is the one a load would read (two controllers in one process on one
store: an SQLite file, a real PostgreSQL database)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from prometheus_client import generate_latest

from controller.app import ControllerApp
from controller.errors import StoreUnavailable
from controller.fleet.model import Fleet
from controller.metrics import controller_registry
from controller.store.store import Store
from controller.warm_standby import WarmStandby
from tests.controller.harness import T0, Clock, frame, hello
from tests.controller.replica_apps import leader_and_standby
from tests.controller.store.test_store import run


def _as_stored(fleet: Fleet) -> dict[str, Any]:
    """What a load reads from the store, comparable."""
    return {
        "nodes": {
            name: (
                node.hello.SerializeToString(deterministic=True),
                node.first_seen,
                node.last_seen,
                {i: (g.time, g.sample.SerializeToString(deterministic=True)) for i, g in node.gpus.items()},
                node.host_time,
                node.bmc_time,
            )
            for name, node in fleet.nodes.items()
        },
        "probes": {key: (r.time, r.value, r.result.SerializeToString()) for key, r in fleet.probes.items()},
        "history": {key: list(series) for key, series in fleet.history.items()},
        "acked": dict(fleet.acked),
    }


async def _loaded(db: str) -> Fleet:
    store = Store(db)
    await store.open()
    try:
        fleet, _ = await store.load()
        return fleet
    finally:
        store.close()


async def _warm(app: ControllerApp) -> WarmStandby:
    """The standby's warm fleet, once loaded."""
    warm = app.warm
    assert warm is not None
    for _ in range(500):
        if warm.fleet is not None:
            return warm
        await asyncio.sleep(0.02)
    raise AssertionError("the warm standby's load did not finish")


async def _frames(app: ControllerApp, node: str, seqs: range, clock: Clock) -> None:
    for seq in seqs:
        assert await app.ingest.frame(node, frame(seq, node=node, t=clock.now)) == seq
    await app.ingest.flush_state()


def test_a_warm_standby_leads_with_the_fleet_a_load_reads_without_loading_the_store(store_db: str) -> None:
    clock = Clock(T0)

    async def go() -> None:
        async with leader_and_standby(store_db, clock) as replicas:
            leader, standby = replicas.leader, replicas.standby
            warm = await _warm(standby)  # (the store was empty)
            for node in ("n1", "n2"):  # the leader's agents
                assert await leader.ingest.hello(hello(node)) == 0
                await _frames(leader, node, range(1, 3), clock)
            assert await standby.ingest.hello(hello("n3")) == 0  # the standby's own
            await _frames(standby, "n3", range(1, 3), clock)
            # What it would load now, on a connection of its own, is what a load reads.
            apart, findings = await standby.store.load_apart()
            assert _as_stored(apart) == _as_stored(await _loaded(store_db)) and findings == []
            assert sorted(apart.nodes) == ["n1", "n2", "n3"] and len(apart.history) == 3
            clock.now += 1
            assert await warm.look() == ["n1", "n2", "n3"]
            assert warm.fleet is not None and _as_stored(warm.fleet) == _as_stored(apart)
            assert standby.fleet is not warm.fleet  # its ingest keeps its own until it leads
            page = generate_latest(controller_registry(standby, standby=True)).decode()
            assert "gpufleet_controller_standby_fleet_nodes 3.0" in page
            assert "gpufleet_controller_standby_fleet_looks_total 1.0" in page

            # While it waits: new readings and probe results, a new node, a node forgotten.
            clock.now += 20
            await _frames(leader, "n1", range(3, 5), clock)
            assert await leader.ingest.hello(hello("n4", gpus=2)) == 0
            await _frames(leader, "n4", range(1, 2), clock)
            await leader.store.forget_nodes(["n2"])
            clock.now += 5
            assert await warm.look() == ["n1", "n4"]  # n3 and n2 read again for the margin: not loaded
            assert sorted(warm.fleet.nodes) == ["n1", "n3", "n4"]
            clock.now += 20
            await _frames(leader, "n1", range(5, 6), clock)
            await _frames(standby, "n3", range(3, 4), clock)

            loads = 0
            load = standby.store.load

            async def counted() -> Any:
                nonlocal loads
                loads += 1
                return await load()

            standby.store.load = counted  # type: ignore[method-assign]
            leader.close()  # the standby leads now
            await asyncio.wait_for(replicas.waiting, 20)
            assert loads == 0 and standby.fleet is warm.fleet
            # Its own node caught up at the lead; the others' as its last look left them, until the
            # leader's first take-in, due at once, from that look (the nodes it took in not read again).
            feed = standby.replicas
            assert feed is not None and feed.due and feed.since == warm.since
            assert (
                standby.fleet.acked[("n3", "b1")] == 3
                and standby.fleet.probes[("n3", 0, "gemm", "bf16")].value == 703
            )
            assert standby.fleet.acked[("n1", "b1")] == 4 and "n1" in feed.elsewhere
            assert "n3" not in feed.elsewhere  # its own: its agents reconnect here
            await feed.catch_up()  # as the new leader does before its detection starts
            assert not feed.due and feed.taken == 1  # n1 alone
            assert _as_stored(standby.fleet) == _as_stored(await _loaded(store_db))
            # n1's history: every result, the one taken in after the lead too.
            assert [v for _, v in standby.fleet.history[("n1", 0, "gemm", "bf16")]] == [
                701.0,
                702.0,
                703.0,
                704.0,
                705.0,
            ]

    run(go())


def test_a_standby_whose_warm_fleet_cannot_catch_up_loads_the_store(store_db: str) -> None:
    """The last look fails (the store unreachable for it): the standby loads the store as without."""
    clock = Clock(T0)

    async def go() -> None:
        async with leader_and_standby(store_db, clock) as replicas:
            leader, standby = replicas.leader, replicas.standby
            assert await leader.ingest.hello(hello("n1")) == 0
            warm = await _warm(standby)
            await _frames(leader, "n1", range(1, 3), clock)

            async def unreachable(since: float, *, mine: bool = False, apart: bool = False) -> Any:
                raise StoreUnavailable("store unavailable: connection refused")

            standby.store.changed_nodes = unreachable  # type: ignore[method-assign]
            leader.close()
            await asyncio.wait_for(replicas.waiting, 20)
            assert standby.fleet is not warm.fleet
            assert _as_stored(standby.fleet) == _as_stored(await _loaded(store_db))
            assert standby.fleet.acked[("n1", "b1")] == 2
            page = generate_latest(controller_registry(standby)).decode()
            assert "gpufleet_controller_standby_fleet_failures_total 1.0" in page

    run(go())


def test_without_warm_standby_a_standby_holds_no_fleet_while_it_waits(store_db: str) -> None:
    clock = Clock(T0)

    async def go() -> None:
        async with leader_and_standby(store_db, clock, warm_standby=False) as replicas:
            assert await replicas.leader.ingest.hello(hello("n1")) == 0
            await asyncio.sleep(0.2)
            assert replicas.standby.warm is None
            assert replicas.standby.fleet.nodes == {}
            replicas.leader.close()
            await asyncio.wait_for(replicas.waiting, 20)
            assert list(replicas.standby.fleet.nodes) == ["n1"]

    run(go())


def test_after_a_warm_standbys_lead_the_first_take_in_is_at_once(store_db: str) -> None:
    clock = Clock(T0)

    async def go() -> None:
        async with leader_and_standby(store_db, clock) as replicas:
            feed = replicas.feed
            feed.begin(clock.now - 40, {})  # as a warm standby's handover: from its last look
            taken = asyncio.Event()

            async def take_in(*, apart: bool = False) -> list[str]:
                taken.set()
                return []

            feed.take_in = take_in  # type: ignore[method-assign]
            stop = asyncio.Event()
            running = asyncio.create_task(feed.run_forever(stop))
            await asyncio.wait_for(taken.wait(), 1.0)  # not after replica_sync_seconds (5 s)
            stop.set()
            await running

    run(go())


def test_a_warm_standby_leading_on_its_agents_streams_carries_them_from_memory_history_and_all(
    store_db: str,
) -> None:
    """takeover.streams_kept (controller/server.py): the nodes still streaming to the standby are not read
    again at the lead but carried over from its ingest's fleet, their probe history read where the
    warm fleet's is behind (here: a node taken over from the leader since the warm fleet's load);
    the fleet it leads with is still the one a load reads."""
    clock = Clock(T0)

    async def go() -> None:
        async with leader_and_standby(store_db, clock) as replicas:
            leader, standby = replicas.leader, replicas.standby
            warm = await _warm(standby)
            assert await leader.ingest.hello(hello("n3")) == 0
            await _frames(leader, "n3", range(1, 3), clock)
            clock.now += 20
            assert await standby.ingest.hello(hello("n3")) == 2  # its agent moves: taken over
            await _frames(standby, "n3", range(3, 5), clock)
            assert await standby.ingest.frame("n3", frame(5, node="n3", t=clock.now)) == 5  # readings unsaved
            node = standby.fleet.nodes["n3"]  # its history: the result taken over and three since
            assert [v for _, v in standby.fleet.history[("n3", 0, "gemm", "bf16")]] == [702, 703, 704, 705]
            standby.connected("n3")
            standby.takeover.streams_kept = True
            read: list[str] = []
            load_nodes = standby.store.load_nodes

            async def counted(names: list[str], *args: Any, **kwargs: Any) -> Any:
                read.extend(names)
                return await load_nodes(names, *args, **kwargs)

            standby.store.load_nodes = counted  # type: ignore[method-assign,assignment]
            leader.close()
            await asyncio.wait_for(replicas.waiting, 20)
            assert standby.fleet is warm.fleet and standby.ingest.fleet is standby.fleet
            assert "n3" not in read and standby.fleet.nodes["n3"] is node and node.connected
            assert [v for _, v in standby.fleet.history[("n3", 0, "gemm", "bf16")]] == [
                701,
                702,
                703,
                704,
                705,
            ]
            assert standby.fleet.acked[("n3", "b1")] == 5
            feed = standby.replicas
            assert feed is not None
            await feed.catch_up()
            assert "n3" in standby.ingest.unsaved  # not stored as it took the lead: carried instead
            await standby.ingest.flush_state()  # (as it stops)
            assert _as_stored(standby.fleet) == _as_stored(await _loaded(store_db))

    run(go())


def test_a_warm_standbys_look_is_not_queued_behind_its_agents_writes(store_db: str) -> None:
    """A look reads on a connection of its own: with the store thread held up (a burst of its agents'
    writes), it takes in what is committed, and the writes go on once the thread is free."""
    clock = Clock(T0)

    async def go() -> None:
        async with leader_and_standby(store_db, clock) as replicas:
            leader, standby = replicas.leader, replicas.standby
            warm = await _warm(standby)
            assert await leader.ingest.hello(hello("n1")) == 0
            await _frames(leader, "n1", range(1, 3), clock)
            release = threading.Event()
            held = standby.store._thread.submit(lambda _: release.wait(20))
            try:
                clock.now += 1
                assert await asyncio.wait_for(warm.look(), 10) == ["n1"]
                assert warm.fleet is not None and warm.fleet.acked[("n1", "b1")] == 2
                assert not held.done()  # the store thread was held all along
            finally:
                release.set()
            assert await held

    run(go())
