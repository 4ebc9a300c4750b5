"""The statements a batch of writes costs, on both backends (tests/store_backends.py). Savepoints only
where a batch needs them (controller/store/writer.py): frames written together commit without a
savepoint each; a job that fails among them is undone alone (the batch rolled back and run again,
each job in its savepoint); a job that may not run twice is never run twice; a job alone is rolled
back with its transaction. Frames with nothing to store but their ack positions are written as one,
and a replica's latest readings of many nodes check their owners together."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from controller.errors import NotOwner, StoreUnavailable
from controller.fleet.model import FrameWrite, NodeState
from controller.store.sql import Conn
from controller.store.store import Store
from tests.controller.store.test_store import hello, run, write

NODES = ("n1", "n2", "n3")


def _record(conn: Any, said: list[str]) -> None:
    """Every statement the store thread's connection runs from now on goes into `said`."""
    if isinstance(conn, sqlite3.Connection):
        conn.set_trace_callback(said.append)
        return
    execute = conn.execute  # (PostgreSQL: the store's PgConnection)

    def recorded(sql: str, parameters: Any = (), /) -> Any:
        said.append(sql)
        return execute(sql, parameters)

    conn.execute = recorded


async def _one_batch(store: Store, queue: Callable[[], list[Awaitable[Any]]]) -> tuple[list[Any], list[str]]:
    """What `queue` submits, run as one batch (queued while the store thread is held); the results
    (errors as values) and the statements the batch ran."""
    busy, release = threading.Event(), threading.Event()
    said: list[str] = []

    def hold(conn: Conn) -> None:
        _record(conn, said)
        busy.set()
        release.wait(10)

    held = store._thread.submit(hold)
    await asyncio.to_thread(busy.wait, 10)
    pending = [asyncio.ensure_future(a) for a in queue()]
    await asyncio.sleep(0.05)  # every job queued behind the held one
    said.clear()
    release.set()
    await held
    results = await asyncio.gather(*pending, return_exceptions=True)
    return results, said


def _savepoints(said: list[str]) -> int:
    return sum(1 for sql in said if sql.strip().upper().startswith("SAVEPOINT"))


async def _store_with_nodes(db: str, owner: str | None = None, names: tuple[str, ...] = NODES) -> Store:
    store = Store(db)
    if owner is not None:
        store.owner = owner
    await store.open()
    for node in names:
        if owner is not None:
            await store.claim_node(node)
        await store.save_hello(hello(node), 100.0)
    return store


async def _acked(store: Store) -> dict[str, int]:
    fleet, _ = await store.load()
    return {node: seq for (node, _), seq in fleet.acked.items()}


def test_frames_written_together_commit_without_a_savepoint_each(store_db: str) -> None:
    """...where a batch with a job that may not run twice takes one per job."""

    async def go() -> None:
        store = await _store_with_nodes(store_db)
        results, said = await _one_batch(store, lambda: [store.save_frame(write(1, n)) for n in NODES])
        assert results == [None, None, None]
        assert _savepoints(said) == 0, said
        assert sum(sql.upper().startswith("BEGIN") for sql in said) == 1, said  # one transaction

        def plain(conn: Conn) -> int:
            return int(conn.execute("SELECT COUNT(*) FROM nodes").fetchone()[0])

        results, said = await _one_batch(
            store, lambda: [*(store.save_frame(write(2, n)) for n in NODES), store._thread.call(plain)]
        )
        assert results == [None, None, None, 3]
        assert _savepoints(said) == 4, said
        assert await _acked(store) == {"n1": 2, "n2": 2, "n3": 2}
        assert store.batches_run_again == 0
        store.close()

    run(go())


# The database refuses to update node n2's row (the test's fault, on either backend).
REFUSE_N2 = {
    "sqlite": [
        "CREATE TRIGGER refuse_n2 BEFORE UPDATE ON nodes WHEN NEW.name = 'n2' "
        "BEGIN SELECT RAISE(ABORT, 'refused'); END"
    ],
    "postgresql": [
        "CREATE FUNCTION refuse_n2() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.name = 'n2' THEN RAISE EXCEPTION 'refused'; END IF; RETURN NEW; END $$",
        "CREATE TRIGGER refuse_n2 BEFORE UPDATE ON nodes FOR EACH ROW EXECUTE FUNCTION refuse_n2()",
    ],
}


def test_hellos_among_frames_commit_without_a_savepoint_each_and_are_saved_as_one(store_db: str) -> None:
    """A fleet reconnecting at once: its Hellos queued among frames. No savepoint for any job (a
    Hello gave each job of its batch one); the Hellos one after another read their boots' ack
    positions in one statement; each gets what it would alone (an old boot's position, a new boot's
    0, a node never seen 0), and the last of a node's Hellos is the one kept."""

    async def go() -> None:
        store = await _store_with_nodes(store_db)
        await store.save_frame(write(7, "n1"))
        later = hello("n2", "b2")
        later.agent_version = "t2"
        results, said = await _one_batch(
            store,
            lambda: [
                store.save_hello(hello("n1"), 200.0),
                store.save_hello(hello("n2"), 200.0),
                store.save_hello(later, 201.0),
                store.save_hello(hello("new"), 200.0),
                store.save_frame(write(1, "n3")),
                store.save_hello(hello("n3", "b9"), 202.0),
            ],
        )
        assert results == [7, 0, 0, 0, None, 0]
        assert _savepoints(said) == 0, said
        assert sum(sql.upper().startswith("BEGIN") for sql in said) == 1, said
        one_by_one = [sql for sql in said if "acked_seq FROM boots WHERE node = " in sql]
        together = [sql for sql in said if "FROM boots WHERE node IN" in sql]
        assert (len(one_by_one), len(together)) == (1, 1), said  # n3's Hello alone, after the frame
        assert store.batches_run_again == 0
        fleet, _ = await store.load()
        assert fleet.nodes["n2"].hello.agent_version == "t2"
        assert fleet.nodes["n2"].first_seen == 100.0 and fleet.nodes["n2"].last_seen == 201.0
        assert set(fleet.nodes) == {*NODES, "new"}
        store.close()

    run(go())


def test_a_hello_that_fails_among_others_is_refused_alone(store_db: str) -> None:
    """The group's one statement fails: the batch runs again, each Hello in its savepoint, and only
    the one the database refuses fails."""

    async def go() -> None:
        store = await _store_with_nodes(store_db)
        for sql in REFUSE_N2["postgresql" if store_db.startswith("postgresql") else "sqlite"]:

            def refuse(conn: Conn, sql: str = sql) -> None:
                conn.execute(sql)

            await store._thread.call(refuse)
        results, said = await _one_batch(store, lambda: [store.save_hello(hello(n), 300.0) for n in NODES])
        assert results[0] == 0 and results[2] == 0, results
        assert isinstance(results[1], StoreUnavailable), results
        assert store.batches_run_again == 1
        assert _savepoints(said) == 3, said
        fleet, _ = await store.load()
        assert {n: s.last_seen for n, s in fleet.nodes.items()} == {"n1": 300.0, "n2": 100.0, "n3": 300.0}
        store.close()

    run(go())


def _plain(seq: int, node: str) -> FrameWrite:
    """A frame with nothing to store but its ack position (its readings not due, no probe result)."""
    return FrameWrite(node, "b1", seq, 1000.0 + seq, state=False)


def test_frames_with_only_their_ack_position_are_written_as_one(store_db: str) -> None:
    """One statement on node_owners for three frames of a replica (was one each); a frame with
    more to store runs on its own, between the others."""

    async def go() -> None:
        store = await _store_with_nodes(store_db, owner="a:1")
        results, said = await _one_batch(store, lambda: [store.save_frame(_plain(1, n)) for n in NODES])
        assert results == [None, None, None]
        assert len([sql for sql in said if "node_owners" in sql]) == 1, said
        assert _savepoints(said) == 0, said
        assert await _acked(store) == {"n1": 1, "n2": 1, "n3": 1}

        frames = [_plain(2, "n1"), write(2, "n2"), _plain(2, "n3")]
        results, said = await _one_batch(store, lambda: [store.save_frame(f) for f in frames])
        assert results == [None, None, None]
        assert len([sql for sql in said if "node_owners" in sql]) == 3, said
        assert await _acked(store) == {"n1": 2, "n2": 2, "n3": 2}
        assert store.batches_run_again == 0
        store.close()

    run(go())


@pytest.mark.parametrize("frame", [_plain, write], ids=["ack_only", "with_readings_and_probes"])
def test_a_frame_another_replica_took_is_refused_alone_in_its_batch(
    store_db: str, frame: Callable[[int, str], FrameWrite]
) -> None:
    """The batch (the frames written as one, or each on its own) is rolled back and run again,
    each frame in its savepoint: the other two stored."""

    async def go() -> None:
        store = await _store_with_nodes(store_db, owner="a:1")
        taken = "UPDATE node_owners SET holder = 'b:2' WHERE node = 'n2'"  # (replica b's claim)
        await store._thread.call(lambda c: c.execute(taken))
        results, said = await _one_batch(store, lambda: [store.save_frame(frame(1, n)) for n in NODES])
        assert results[0] is None and results[2] is None, results
        assert isinstance(results[1], NotOwner), results
        assert _savepoints(said) == 3, said  # the second run's
        assert store.batches_run_again == 1
        assert await _acked(store) == {"n1": 1, "n3": 1}
        store.close()

    run(go())


def test_a_job_that_may_not_run_twice_runs_once_when_another_fails(store_db: str) -> None:
    async def go() -> None:
        store = await _store_with_nodes(store_db)
        runs: list[int] = []

        def counted(conn: Conn) -> None:
            runs.append(1)
            conn.execute("UPDATE nodes SET last_seen = 500.0 WHERE name = 'n1'")

        def broken(conn: Conn) -> None:
            conn.execute("INSERT INTO nodes (name) VALUES ('x')")  # violates NOT NULL

        results, said = await _one_batch(
            store,
            lambda: [
                store.save_frame(write(1, "n1")),
                store._thread.call(counted),
                store._thread.submit(broken, replayable=True),
            ],
        )
        assert results[:2] == [None, None] and isinstance(results[2], StoreUnavailable), results
        assert runs == [1]
        assert _savepoints(said) == 3, said
        assert store.batches_run_again == 0  # savepoints from the start
        last_seen = await store._thread.call(
            lambda c: c.execute("SELECT last_seen FROM nodes WHERE name = 'n1'").fetchone()[0]
        )
        assert last_seen == 500.0
        assert await _acked(store) == {"n1": 1}
        store.close()

    run(go())


def test_a_job_alone_that_fails_leaves_nothing_it_wrote(store_db: str) -> None:
    async def go() -> None:
        store = await _store_with_nodes(store_db)

        def half(conn: Conn) -> None:
            conn.execute("DELETE FROM nodes WHERE name = 'n1'")
            conn.execute("INSERT INTO nodes (name) VALUES ('x')")  # violates NOT NULL

        results, said = await _one_batch(store, lambda: [store._thread.call(half)])
        assert isinstance(results[0], StoreUnavailable), results
        assert _savepoints(said) == 0, said
        assert await store.node_names() == set(NODES)
        await store.save_frame(write(1, "n1"))  # the connection goes on
        assert await _acked(store) == {"n1": 1}
        store.close()

    run(go())


def test_a_replicas_readings_of_many_nodes_check_their_owners_together(store_db: str) -> None:
    """One statement on node_owners for twelve nodes it owns (was an UPDATE each), all marked
    written; when another replica took one, that one is left to it and the others written."""
    names = tuple(f"n{i}" for i in range(1, 13))

    async def go() -> None:
        store = await _store_with_nodes(store_db, owner="a:1", names=names)
        clock = [700.0]
        store.owner_clock = lambda: clock[0]

        def nodes(seq: int) -> list[NodeState]:
            states = []
            for name in names:
                node = NodeState(name, hello(name), 100.0, 100.0)
                node.gpus = {g.index: g for g in write(seq, name).gpus}
                states.append(node)
            return states

        async def stored() -> tuple[dict[str, float], dict[str, float]]:
            fleet, _ = await store.load()
            written = await store._thread.call(
                lambda c: dict(c.execute("SELECT node, written FROM node_owners").fetchall())
            )
            return {n: s.gpus[0].sample.power_watts for n, s in fleet.nodes.items()}, written

        results, said = await _one_batch(store, lambda: [store.queue_latest(nodes(5))])
        assert results == [0]
        assert len([sql for sql in said if "node_owners" in sql]) == 1, said
        assert await stored() == ({n: 505.0 for n in names}, {n: 700.0 for n in names})

        taken = "UPDATE node_owners SET holder = 'b:2' WHERE node = 'n2'"
        await store._thread.call(lambda c: c.execute(taken))
        clock[0] = 800.0
        assert await store.queue_latest(nodes(6)) == 0
        powers, written = await stored()
        assert powers == {n: 505.0 if n == "n2" else 506.0 for n in names}
        assert written == {n: 700.0 if n == "n2" else 800.0 for n in names}
        store.close()

    run(go())
