"""Store.load brings the newest probe results of each key back into Fleet.history (own-history
baselines survive a controller restart)."""

from __future__ import annotations

import asyncio
import sys
from functools import partial

import pytest

from controller.fleet.model import Fleet, FrameWrite, ProbeRecord
from controller.fleet.series import HISTORY_POINTS
from controller.store import logged_history
from controller.store import nodes as node_rows
from controller.store.sql import Conn
from controller.store.store import Store
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.store.test_store import hello


def probe_write(seq: int) -> FrameWrite:
    """Frame `seq`: a GPU gemm result and a node-level nccl result."""
    time = 1000.0 + seq
    gemm = ProbeRecord(
        "n1",
        0,
        "gemm",
        "bf16",
        700.0 + seq,
        "TFLOP/s",
        time,
        pb.ProbeResult(probe="gemm").SerializeToString(),
    )
    nccl = ProbeRecord(
        "n1",
        None,
        "nccl",
        "all_reduce",
        400.0 + seq,
        "GB/s",
        time,
        pb.ProbeResult(probe="nccl").SerializeToString(),
    )
    return FrameWrite("n1", "b1", seq, time, probes=[gemm, nccl])


async def reloaded(db: str) -> Fleet:
    """The fleet a controller starting on `db` loads."""
    store = Store(db)
    await store.open()
    try:
        fleet, _ = await store.load()
    finally:
        store.close()
    return fleet


def test_load_brings_back_the_newest_results_of_each_key_oldest_first(store_db: str) -> None:
    async def body() -> Fleet:
        store = Store(store_db)
        await store.open()
        await store.save_hello(hello(), 1000.0)
        for seq in range(HISTORY_POINTS + 10, 0, -1):  # stored newest first: load orders them
            await store.save_frame(probe_write(seq))
        store.close()
        return await reloaded(store_db)

    fleet = asyncio.run(body())
    assert set(fleet.history) == {("n1", 0, "gemm", "bf16"), ("n1", None, "nccl", "all_reduce")}
    gemm = list(fleet.history[("n1", 0, "gemm", "bf16")])
    assert len(gemm) == HISTORY_POINTS
    assert gemm[0] == (1011.0, 711.0) and gemm[-1] == (1000.0 + HISTORY_POINTS + 10, 710.0 + HISTORY_POINTS)
    assert [t for t, _ in gemm] == sorted(t for t, _ in gemm)
    nccl = fleet.history[("n1", None, "nccl", "all_reduce")]
    assert len(nccl) == HISTORY_POINTS and nccl[-1][1] == 400.0 + HISTORY_POINTS + 10


def node_write(node: str, seq: int) -> FrameWrite:
    """Frame `seq` of `node`: one GPU gemm result."""
    record = ProbeRecord.of(
        node, 0, pb.ProbeResult(probe="gemm", variant="bf16", value=700.0 + seq), 1000.0 + seq
    )
    return FrameWrite(node, "b1", seq, 1000.0 + seq, probes=[record])


def logged_before(conn: Conn, node: str, seqs: range) -> None:
    """probe_history's rows as a controller from before probe_series wrote them: node_write's results."""
    conn.executemany(
        "INSERT INTO probe_history (node, gpu, probe, variant, time, value) VALUES (?, ?, ?, ?, ?, ?)",
        [(node, 0, "gemm", "bf16", 1000.0 + seq, 700.0 + seq) for seq in seqs],
    )


def test_a_store_from_before_probe_series_gets_it_once_from_probe_history(
    store_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store written before probe_series: the first open fills it from probe_history (a few nodes
    at a time), so the history survives the upgrade; later opens leave it alone."""
    monkeypatch.setattr(node_rows, "FILL_NODES", 1)  # two nodes: two reads of probe_history

    async def rows(store: Store) -> list[tuple[str, int]]:
        return await store._call(
            "test",
            lambda c: [
                (str(n), len(bytes(p)) // 16)
                for n, p in c.execute("SELECT node, points FROM probe_series ORDER BY node").fetchall()
            ],
        )

    async def body() -> tuple[Fleet, list[tuple[str, int]], list[tuple[str, int]]]:
        store = Store(store_db)
        await store.open()
        for node in ("n1", "n2"):
            await store.save_hello(hello(node), 1000.0)
            await store._call("test", partial(logged_before, node=node, seqs=range(1, HISTORY_POINTS + 4)))
        store.close()
        store = Store(store_db)
        await store.open()
        filled = await rows(store)
        # Changed behind its back: a later open must not fill again (probe_series is not empty).
        await store._call("test", lambda c: c.execute("DELETE FROM probe_series WHERE node = 'n2'"))
        store.close()
        store = Store(store_db)
        await store.open()
        try:
            again = await rows(store)
            fleet, _ = await store.load()
        finally:
            store.close()
        return fleet, filled, again

    fleet, filled, again = asyncio.run(body())
    assert filled == [("n1", HISTORY_POINTS), ("n2", HISTORY_POINTS)]
    assert again == [("n1", HISTORY_POINTS)]
    gemm = list(fleet.history[("n1", 0, "gemm", "bf16")])
    assert gemm[0] == (1004.0, 704.0) and gemm[-1] == (
        1000.0 + HISTORY_POINTS + 3,
        700.0 + HISTORY_POINTS + 3,
    )
    assert ("n2", 0, "gemm", "bf16") not in fleet.history


def test_forgetting_a_node_drops_its_series(store_db: str) -> None:
    async def body() -> Fleet:
        store = Store(store_db)
        await store.open()
        for node in ("n1", "n2"):
            await store.save_hello(hello(node), 1000.0)
            await store.save_frame(node_write(node, 1))
        await store.forget_nodes(["n1"])
        store.close()
        return await reloaded(store_db)

    fleet = asyncio.run(body())
    assert list(fleet.history) == [("n2", 0, "gemm", "bf16")]


def test_the_loaded_keys_share_their_strings(store_db: str) -> None:
    """Each node's name is one string in the loaded fleet (its NodeState's), not a copy for every
    probe key and record: 712,500 keys at 12,500 nodes; probes' and variants' names likewise."""

    async def body() -> Fleet:
        store = Store(store_db)
        await store.open()
        for node in ("n1", "n2"):
            await store.save_hello(hello(node), 1000.0)
            await store.save_frame(probe_write(1) if node == "n1" else node_write(node, 1))
        store.close()
        return await reloaded(store_db)

    fleet = asyncio.run(body())
    keys = [*fleet.history, *fleet.probes]
    assert len(keys) == 6
    for key in keys:
        assert key[0] is fleet.nodes[key[0]].name
        assert key[2] is sys.intern(key[2]) and key[3] is sys.intern(key[3])
    for record in fleet.probes.values():
        assert record.node is fleet.nodes[record.node].name and record.probe is sys.intern(record.probe)


def test_probe_results_are_not_logged_and_rows_from_before_age_out(store_db: str) -> None:
    """A result goes into its key's series, not probe_history (30 days of rows nobody read: 34
    million a day at 12,500 nodes); rows a controller from before logged go at the hourly prune once
    older than its cutoff, and the series stay."""

    async def logged(store: Store) -> list[float]:
        return await store._call(
            "test",
            lambda c: [
                float(t) for (t,) in c.execute("SELECT time FROM probe_history ORDER BY time").fetchall()
            ],
        )

    async def body() -> tuple[list[float], int, list[float], Fleet]:
        store = Store(store_db)
        await store.open()
        try:
            await store.save_hello(hello("n1"), 1000.0)
            for seq in (1, 2, 3):
                await store.save_frame(node_write("n1", seq))
            written = await logged(store)
            await store.save_hello(hello("n2"), 1000.0)
            await store._call("test", partial(logged_before, node="n2", seqs=range(1, 5)))  # 1001 .. 1004
            pruned = await store.prune_history(1003.0)
            left = await logged(store)
        finally:
            store.close()
        return written, pruned, left, await reloaded(store_db)

    written, pruned, left, fleet = asyncio.run(body())
    assert written == []
    assert (pruned, left) == (2, [1003.0, 1004.0])
    assert list(fleet.history[("n1", 0, "gemm", "bf16")]) == [
        (1001.0, 701.0),
        (1002.0, 702.0),
        (1003.0, 703.0),
    ]


def test_an_old_stores_logged_rows_are_pruned_a_few_nodes_a_job(
    store_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """probe_history has no index on time: one DELETE read the whole table in the store's thread.
    The prune goes PRUNE_NODES nodes a job (the index by node); an empty table costs no more jobs."""
    monkeypatch.setattr(logged_history, "PRUNE_NODES", 2)

    async def jobs(store: Store) -> int:
        return int(store.latency.by_label["prune_history"].count)

    async def body() -> tuple[int, list[int], list[tuple[str, float]], int, int]:
        store = Store(store_db)
        await store.open()
        try:
            for node in ("n1", "n2", "n3", "n4", "n5"):
                await store.save_hello(hello(node), 1000.0)
                await store._call("test", partial(logged_before, node=node, seqs=range(1, 4)))  # 1001 .. 1003
            pruned = [await store.prune_history(1002.5)]
            first = await jobs(store)
            left = await store._call(
                "test",
                lambda c: [
                    (str(n), float(t))
                    for n, t in c.execute(
                        "SELECT node, time FROM probe_history ORDER BY node, time"
                    ).fetchall()
                ],
            )
            pruned.append(await store.prune_history(2000.0))  # every row
            second = await jobs(store) - first
            pruned.append(await store.prune_history(3000.0))
            empty = await jobs(store) - first - second
        finally:
            store.close()
        return first, pruned, left, second, empty

    first, pruned, left, second, empty = asyncio.run(body())
    assert pruned == [10, 5, 0]
    assert left == [(f"n{i}", 1003.0) for i in range(1, 6)]
    assert first == second == 1 + 3  # the look (and the commands' prune), then 5 nodes 2 at a time
    assert empty == 1  # an empty table: the look alone
