"""Hellos queued together on a replica are taken as one (Store._takes_together, on both backends):
when a replica dies its agents' Hellos reach the heir by the thousand, and each took a dozen round
trips to the server alone. Together they get exactly what each would alone (the replica that had
the node, its rows as stored, its boot's ack position); a node twice in the group, or a row another
transaction holds, and the group goes Hello by Hello."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import psycopg

from controller.store.store import Store, TakenNode
from controller.store.stored_nodes import StoredNodes
from tests.controller.store.test_batch_statements import _one_batch
from tests.controller.store.test_owners import _replica
from tests.controller.store.test_store import hello, run, write
from tests.postgres_server import PostgresServer

# A claim's read of the owner rows, one node's or a group's (upper-cased: SQLite's trace has its own case)
CLAIM_READS = ("SELECT HOLDER FROM NODE_OWNERS", "SELECT NODE, HOLDER FROM NODE_OWNERS")


async def _a_writing(db: str, clock: list[float], names: list[str]) -> tuple[Store, Store]:
    """Replicas a and b, a owning `names`, each with frames 1..2 stored (readings, a probe result)."""
    a, b = _replica(db, "a:1", clock), _replica(db, "b:2", clock)
    await a.open()
    await b.open()
    for name in names:
        await a.claim_node(name)
        await a.save_hello(hello(name), 100.0)
        for seq in (1, 2):
            write_ = write(seq, name)
            write_.state = True
            await a.save_frame(write_)
    return a, b


def _shape(taken: TakenNode, node: str) -> tuple[Any, ...]:
    """What a take got, with the node's name taken out (to compare one node's with another's)."""
    rows = taken.rows

    def named(value: Any) -> Any:
        if isinstance(value, bytes):  # a Hello names its node
            return value.replace(node.encode(), b"N")
        return "N" if value == node else value

    def rows_of(table: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        return sorted(tuple(map(named, row)) for row in table)

    tables = None if rows is None else [rows_of(getattr(rows, t)) for t in StoredNodes.__slots__]
    return taken.before, taken.acked, tables


def _claim_reads(said: list[str]) -> int:
    return sum(1 for sql in said if sql.strip().upper().startswith(CLAIM_READS))


def test_hellos_queued_together_are_taken_as_one_and_each_gets_what_it_would_alone(store_db: str) -> None:
    clock = [200.0]
    names = ["n1", "n2", "n3", "n4", "n5", "n6"]

    async def go() -> None:
        a, b = await _a_writing(store_db, clock, names)
        together, said = await _one_batch(
            b, lambda: [b.take_node(hello(n), 300.0, known=False) for n in names[:3]]
        )
        assert _claim_reads(said) == 1  # one read of the three owner rows (three, one by one)
        alone = [await b.take_node(hello(n), 300.0, known=False) for n in names[3:]]
        assert [t.before for t in together] == ["a:1"] * 3 and [t.acked for t in together] == [2] * 3
        assert [_shape(t, n) for t, n in zip(together, names[:3], strict=True)] == [
            _shape(t, n) for t, n in zip(alone, names[3:], strict=True)
        ]
        for taken, name in zip(together, names[:3], strict=True):  # each its own node's rows only
            assert taken.rows is not None and {row[0] for row in taken.rows.gpus} == {name}
        owners = await b._thread.call(
            lambda c: dict(c.execute("SELECT node, holder FROM node_owners").fetchall())
        )
        assert owners == dict.fromkeys(names, "b:2")

        # Nodes this replica holds already, one of them its own: not read again, the others' are.
        clock[0] = 210.0
        again, _ = await _one_batch(
            a,
            lambda: [
                a.take_node(hello("n1", "b2"), 310.0, known=True),
                a.take_node(hello("n2"), 310.0, known=True),
            ],
        )
        assert [(t.before, t.acked) for t in again] == [("b:2", 0), ("b:2", 2)]
        assert all(t.rows is not None for t in again)
        mine, _ = await _one_batch(a, lambda: [a.take_node(hello("n1", "b2"), 320.0, known=True)])
        assert (mine[0].before, mine[0].rows, mine[0].acked) == (None, None, 0)
        a.close()
        b.close()

    run(go())


def test_a_node_twice_in_the_group_goes_hello_by_hello(store_db: str) -> None:
    """The second Hello of a node finds it this replica's already, as it would one after another."""
    clock = [200.0]

    async def go() -> None:
        a, b = await _a_writing(store_db, clock, ["n1", "n2"])
        results, said = await _one_batch(
            b,
            lambda: [
                b.take_node(hello("n1"), 300.0, known=False),
                b.take_node(hello("n2"), 300.0, known=False),
                b.take_node(hello("n1"), 301.0, known=True),
            ],
        )
        assert [(t.before, t.rows is None) for t in results] == [("a:1", False), ("a:1", False), (None, True)]
        assert _claim_reads(said) == 3  # one by one
        a.close()
        b.close()

    run(go())


def test_a_row_another_transaction_holds_sends_the_group_hello_by_hello(
    postgres_server: PostgresServer,
) -> None:
    """On PostgreSQL's row locks: another transaction holds n2's owner row (a replica's open batch
    writing it) while three Hellos are taken together. The group goes Hello by Hello: n1 and n3 are
    taken at once, n2 once the row is let go (its claim comes again), nothing twice."""
    clock = [200.0]
    db = postgres_server.new_database()

    async def go() -> None:
        a, b = await _a_writing(db, clock, ["n1", "n2", "n3"])
        held, release = threading.Event(), threading.Event()

        def hold_n2() -> None:
            with psycopg.connect(db) as conn:
                conn.execute("SELECT node FROM node_owners WHERE node = 'n2' FOR UPDATE")
                held.set()
                release.wait(10)
                conn.rollback()

        holder = asyncio.create_task(asyncio.to_thread(hold_n2))
        await asyncio.to_thread(held.wait, 10)
        asyncio.get_running_loop().call_later(0.5, release.set)
        taken, _ = await _one_batch(
            b, lambda: [b.take_node(hello(n), 300.0, known=False) for n in ("n1", "n2", "n3")]
        )
        await holder
        assert [t.before for t in taken] == ["a:1"] * 3 and [t.acked for t in taken] == [2] * 3
        assert b.claim_retries >= 1 and b._thread.batches_run_again >= 1
        owners = await b._thread.call(
            lambda c: dict(c.execute("SELECT node, holder FROM node_owners").fetchall())
        )
        assert owners == {"n1": "b:2", "n2": "b:2", "n3": "b:2"}
        a.close()
        b.close()

    run(go())
