"""Nodes spread over replicas, in the store, on both backends (tests/store_backends.py): the newest
stream's replica owns a node; a replica that lost it writes nothing more of it; the leader finds
what the others wrote, and loads just those nodes."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from controller.errors import NotOwner, RowBusy, StoreUnavailable
from controller.fleet.model import NodeState
from controller.store import stored_nodes
from controller.store.owners import owners
from controller.store.store import Store
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.store.test_store import hello, run, write
from tests.postgres_server import PostgresServer


def _replica(db: str, name: str, clock: list[float]) -> Store:
    store = Store(db)
    store.owner, store.owner_clock = name, lambda: clock[0]
    return store


async def _a_holding_both(db: str, clock: list[float]) -> tuple[Store, Store, list[NodeState]]:
    """Replicas a and b, a owning n1 and n2 (frame 1 stored), and both nodes' newer readings (frame
    7's) as a's memory holds them."""
    a, b = _replica(db, "a:1", clock), _replica(db, "b:2", clock)
    await a.open()
    await b.open()
    nodes = []
    for name in ("n1", "n2"):
        await a.claim_node(name)
        await a.save_hello(hello(name), 100.0)
        await a.save_frame(write(1, name))
        state = NodeState(name, hello(name), 100.0, 100.0)
        state.gpus = {g.index: g for g in write(7, name).gpus}
        nodes.append(state)
    return a, b, nodes


async def _two_replicas(db: str, clock: list[float]) -> tuple[Store, Store]:
    """Replicas a and b, a owning n1 and b owning n2, each node with frame 1 stored."""
    a, b = _replica(db, "a:1", clock), _replica(db, "b:2", clock)
    await a.open()
    await b.open()
    for store, node in ((a, "n1"), (b, "n2")):
        assert await store.claim_node(node) is None
        await store.save_hello(hello(node), 100.0)
        await store.save_frame(write(1, node))
    return a, b


async def _one_batch_each(
    stores: tuple[Store, Store], jobs: Callable[[Callable[[Store], Any]], list[Any]]
) -> tuple[list[Any], float]:
    """Hold both store threads, queue `jobs(meet)` (each store's in one batch behind its hold), let
    both go together; the jobs' results (or errors) and the seconds they took once let go.

    `meet(store)` is a job that waits, inside its store's open transaction, until the other store's
    batch has reached its own meet: the jobs before it in both batches have run (uncommitted) before
    either batch goes on. Without it, on a busy machine one thread could run and commit its whole
    batch before the other began, and the crossing under test never happened (a red CI run)."""
    meeting = threading.Barrier(2)

    async def meet(store: Store) -> None:
        await store._thread.call(lambda conn: meeting.wait(10))

    release = threading.Event()
    ready = [threading.Event(), threading.Event()]
    holds = []
    for store, event in zip(stores, ready, strict=True):

        def hold(conn: Any, event: threading.Event = event) -> None:
            event.set()
            release.wait(10)

        holds.append(store._thread.submit(hold))
    for event in ready:
        await asyncio.to_thread(event.wait, 10)
    tasks = [asyncio.ensure_future(job) for job in jobs(meet)]
    await asyncio.sleep(0.05)  # every job queued behind its store's hold
    began = asyncio.get_running_loop().time()
    release.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    took = asyncio.get_running_loop().time() - began
    await asyncio.gather(*holds)
    return results, took


def test_the_newest_streams_replica_owns_the_node_and_the_one_before_writes_nothing_more(
    store_db: str,
) -> None:
    clock = [100.0]

    async def go() -> None:
        a, b = _replica(store_db, "a:1", clock), _replica(store_db, "b:2", clock)
        await a.open()
        await b.open()
        assert await a.claim_node("n1") is None  # nobody had it
        assert await a.claim_node("n1") is None  # itself
        await a.save_hello(hello(), 100.0)
        await a.save_frame(write(1))
        clock[0] = 110.0
        assert await b.claim_node("n1") == "a:1"  # its agent connected to b: b owns it now
        with pytest.raises(NotOwner, match=r"node n1 is ingested by replica b:2 now"):
            await a.save_frame(write(2))
        await b.save_frame(write(2))
        with pytest.raises(NotOwner):
            await a.save_frame(write(3))
        assert await b.save_hello(hello(), 111.0) == 2  # the refused frame 3 never moved the position
        fleet, _ = await b.load()
        assert fleet.nodes["n1"].gpus[0].sample.power_watts == 502.0  # frame 2's readings, not 3's
        assert await b._thread.call(owners) == {"n1": "b:2"}
        assert await a.claim_node("n1") == "b:2"  # and back: newest stream wins again
        await a.save_frame(write(3))
        a.close()
        b.close()

    run(go())


def test_a_replica_that_lost_a_node_skips_its_readings_and_still_writes_its_others(store_db: str) -> None:
    clock = [100.0]

    async def go() -> None:
        a, b, nodes = await _a_holding_both(store_db, clock)
        await b.claim_node("n2")
        await a.queue_latest(nodes)  # n2's readings are b's to write now
        fleet, _ = await a.load()
        assert fleet.nodes["n1"].gpus[0].sample.power_watts == 507.0
        assert fleet.nodes["n2"].gpus[0].sample.power_watts == 501.0
        a.close()
        b.close()

    run(go())


def test_the_leader_finds_what_other_replicas_wrote_since_it_looked(store_db: str) -> None:
    clock = [100.0]

    async def go() -> None:
        leader, other = _replica(store_db, "lead:1", clock), _replica(store_db, "other:2", clock)
        await leader.open()
        await other.open()
        for name, store in (("mine", leader), ("n1", other), ("n2", other)):
            await store.claim_node(name)
            await store.save_hello(hello(name), 100.0)
        clock[0] = 120.0
        await other.save_frame(write(1, "n1"))
        assert await leader.changed_nodes(110.0) == {"n1": ("other:2", 120.0)}
        assert set(await leader.changed_nodes(99.0)) == {"n1", "n2"}  # never its own
        assert await leader.changed_nodes(120.0) == {}
        leader.close()
        other.close()

    run(go())


def test_load_nodes_loads_just_the_named_nodes_in_chunks(
    store_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stored_nodes, "NAMES_PER_QUERY", 2)

    async def go() -> None:
        store = Store(store_db)
        await store.open()
        for i in range(5):
            await store.save_hello(hello(f"n{i}"), 100.0)
            await store.save_frame(write(1 + i, f"n{i}"))
        rows = await store.load_nodes(["n0", "n2", "n3", "n4"])
        part = rows.fleet()
        assert sorted(part.nodes) == ["n0", "n2", "n3", "n4"]
        assert part.nodes["n3"].gpus[0].sample.power_watts == 504.0
        assert part.nodes["n4"].host is not None
        assert part.acked == {(f"n{i}", "b1"): 1 + i for i in (0, 2, 3, 4)}
        assert {key[0] for key in part.probes} == {"n0", "n2", "n3", "n4"}
        assert (await store.load_nodes([])).fleet().nodes == {}
        unsent = rows.without_hellos({"n2"}).fleet()  # (for a copy that holds n2's Hello)
        assert unsent.nodes["n2"].hello == pb.Hello() and unsent.nodes["n0"].hello == hello("n0")
        store.close()

    run(go())


def test_forgetting_a_node_forgets_its_owner(store_db: str) -> None:
    clock = [100.0]

    async def go() -> None:
        store = _replica(store_db, "a:1", clock)
        await store.open()
        await store.claim_node("n1")
        await store.forget_nodes(["n1"])
        assert await store._thread.call(owners) == {}
        store.close()

    run(go())


def test_two_replicas_claiming_each_others_nodes_at_once_both_get_through(
    postgres_server: PostgresServer,
) -> None:
    """On PostgreSQL's row locks (SQLite has one writer at a time: nothing to cross). Replica a
    writes its node n1 and, in the same group commit, claims b's node n2, while b writes n2 and
    claims n1 (agents crossing over in a reconnect storm). Each batch holds the row its write locked
    and wants the other's: that was a deadlock, one job aborted after deadlock_timeout. Now a claim
    waits briefly, lets its batch commit without it and comes again: both get their node."""
    clock = [100.0]
    store_db = postgres_server.new_database()

    async def go() -> None:
        a, b = await _two_replicas(store_db, clock)
        clock[0] = 110.0
        results, _ = await _one_batch_each(
            (a, b),
            lambda meet: [
                a.save_frame(write(2, "n1")),
                meet(a),
                a.claim_node("n2"),
                b.save_frame(write(2, "n2")),
                meet(b),
                b.claim_node("n1"),
            ],
        )
        assert results == [None, None, "b:2", None, None, "a:1"], results
        assert a.claim_retries + b.claim_retries >= 1  # the crossing happened, and was taken again
        assert await a._thread.call(owners) == {"n1": "b:2", "n2": "a:1"}
        a.close()
        b.close()

    run(go())


def test_replicas_taking_each_others_nodes_while_writing_them_do_not_deadlock(
    postgres_server: PostgresServer,
) -> None:
    """On PostgreSQL's row locks. a owns n1 and b owns n2; in one group commit each takes the
    other's node (its agent reconnected there) and then writes a frame of the node it still holds,
    whose row the other's claim has just locked: each batch waits for the other's. That was a
    deadlock, broken by PostgreSQL only after deadlock_timeout (a second) by aborting one of the
    writes. Now a write does not wait for a row another replica's open claim holds: both claims
    and both batches go through at once, and a frame of a node being taken fails (not acked: its
    agent, connected elsewhere now, sends it there)."""
    clock = [100.0]
    store_db = postgres_server.new_database()

    async def go() -> None:
        a, b = await _two_replicas(store_db, clock)
        clock[0] = 110.0
        results, took = await _one_batch_each(
            (a, b),
            lambda meet: [
                a.claim_node("n2"),
                meet(a),
                a.save_frame(write(2, "n1")),  # its row: b's claim holds it, uncommitted
                b.claim_node("n1"),
                meet(b),
                b.save_frame(write(2, "n2")),
            ],
        )
        assert results[0] == "b:2" and results[3] == "a:1", results  # both claims went through
        for stale in (results[2], results[5]):
            assert isinstance(stale, StoreUnavailable) and "deadlock" not in str(stale), results
        assert a.busy_writes + b.busy_writes >= 1  # the crossing happened
        assert took < 0.9, f"the writes took {took:.2f} s: they waited for the deadlock detector"
        assert await a._thread.call(owners) == {"n1": "b:2", "n2": "a:1"}
        fleet, _ = await a.load()
        assert {n: fleet.acked[(n, "b1")] for n in ("n1", "n2")} == {"n1": 1, "n2": 1}
        a.close()
        b.close()

    run(go())


def test_a_node_being_taken_is_passed_over_by_writes_that_do_not_wait_for_it(
    postgres_server: PostgresServer,
) -> None:
    """While b's claim of n1 is open (not committed), a's frame of n1 fails at once (RowBusy, not
    acked) and a's readings write passes n1 over and writes n2: neither waits for b's transaction."""
    clock = [100.0]
    store_db = postgres_server.new_database()

    async def go() -> None:
        a, b, nodes = await _a_holding_both(store_db, clock)
        claimed, release = threading.Event(), threading.Event()

        def claim_and_hold(conn: Any) -> None:
            conn.execute("UPDATE node_owners SET holder = ? WHERE node = ?", ("b:2", "n1"))
            claimed.set()
            release.wait(10)

        holding = b._thread.submit(claim_and_hold)
        await asyncio.to_thread(claimed.wait, 10)
        try:
            with pytest.raises(RowBusy):
                await asyncio.wait_for(a.save_frame(write(2, "n1")), 5)
            assert await asyncio.wait_for(a.queue_latest(nodes), 5) == 1
            assert a.busy_writes == 2
        finally:
            release.set()
            await holding
        fleet, _ = await a.load()
        assert fleet.acked[("n1", "b1")] == 1  # frame 2 was not stored
        assert fleet.nodes["n1"].gpus[0].sample.power_watts == 501.0  # nor its readings
        assert fleet.nodes["n2"].gpus[0].sample.power_watts == 507.0
        with pytest.raises(NotOwner):  # b's claim committed: a has lost n1
            await a.save_frame(write(2, "n1"))
        a.close()
        b.close()

    run(go())
