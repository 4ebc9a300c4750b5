"""The store on both backends (an SQLite file, a real PostgreSQL database: tests/store_backends.py):
round trips, group commit, a failing job in a batch, reload. SQLite's own cases: test_sqlite.py."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from controller.errors import StoreUnavailable
from controller.fleet.finding import Evidence, Finding
from controller.fleet.findings import StoredFinding
from controller.fleet.model import FrameWrite, GpuState, ProbeRecord
from controller.paging import finding_key
from controller.store.sql import Conn
from controller.store.store import Store
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.harness import bmc_sample

T = TypeVar("T")


def hello(node: str = "n1", boot: str = "b1") -> pb.Hello:
    msg = pb.Hello(node=node, boot_id=boot, agent_version="t")
    msg.inventory.gpus.add(index=0, uuid="GPU-1", name="NVIDIA H100 80GB HBM3")
    return msg


def write(seq: int, node: str = "n1", boot: str = "b1") -> FrameWrite:
    sample = pb.GpuSample(index=0, power_watts=500.0 + seq)
    result = pb.ProbeResult(
        probe="gemm", variant="bf16", gpu=0, value=700.0 + seq, unit="TFLOP/s", peak_ratio=0.7
    )
    return FrameWrite(
        node,
        boot,
        seq,
        1000.0 + seq,
        gpus=[GpuState(0, sample, 1000.0 + seq, {"sw_power_cap": 1000.0})],
        host=pb.HostSample(load1=1.5),
        probes=[ProbeRecord.of(node, 0, result, 1000.0 + seq)],
    )


def finding(node: str = "n1") -> StoredFinding:
    f = Finding(
        node,
        0,
        "power_cap",
        "warning",
        "GPU 0 power cap",
        Evidence("enforced_power_limit_watts", 400.0, 700.0, -0.43, "W", ("sw_power_cap",), 0, "d"),
        [Evidence("sm_clock_hz", 1.6e9)],
        ["throttle"],
    )
    return StoredFinding("id1", f, 10.0, 20.0)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def test_round_trip_and_reload(store_db: str) -> None:
    path = store_db

    async def first() -> None:
        store = Store(path)
        await store.open()
        assert await store.save_hello(hello(), 1.0) == 0
        await store.save_frame(write(1))
        await store.save_frame(write(2))
        await store.save_findings([finding()], [])
        assert await store.save_hello(hello(), 2.0) == 2  # the boot's ack position survives
        store.close()

    async def second() -> None:
        store = Store(path)
        await store.open()
        fleet, active = await store.load()
        store.close()
        node = fleet.nodes["n1"]
        assert node.hello.inventory.gpus[0].uuid == "GPU-1"
        assert node.gpus[0].sample.power_watts == 502.0
        assert node.gpus[0].held == {"sw_power_cap": 1000.0}
        assert node.host is not None and node.host.load1 == 1.5
        assert fleet.acked[("n1", "b1")] == 2
        assert fleet.probes[("n1", 0, "gemm", "bf16")].value == 702.0
        loaded = fleet.probes[("n1", 0, "gemm", "bf16")]
        assert loaded.ratio is None  # not parsed at load: detection reads it in its own process
        assert loaded.peak_ratio == 0.7 and loaded.ratio == 0.7  # read when asked, then kept
        assert loaded == write(2).probes[0]  # whether read yet or not
        assert fleet.probes[("n1", 0, "gemm", "bf16")].result == write(2).probes[0].result
        assert [a.finding for a in active] == [finding().finding]

    async def history() -> tuple[int, int]:
        store = Store(path)
        await store.open()
        points, logged = await store._thread.call(
            lambda c: (
                c.execute("SELECT points FROM probe_series").fetchone()[0],
                c.execute("SELECT count(*) FROM probe_history").fetchone()[0],
            )
        )
        store.close()
        return len(bytes(points)) // 16, int(logged)

    run(first())
    run(second())
    assert run(history()) == (2, 0)  # both results in the key's series; probe_history not written


def test_concurrent_calls_commit_in_groups(store_db: str) -> None:
    async def go() -> None:
        store = Store(store_db)
        await store.open()
        await store.save_hello(hello(), 1.0)
        await asyncio.gather(*(store.save_frame(write(seq)) for seq in range(1, 201)))
        fleet, _ = await store.load()
        store.close()
        assert fleet.acked[("n1", "b1")] in range(1, 201)

    run(go())


def test_one_failing_job_does_not_undo_its_batch(store_db: str, caplog: pytest.LogCaptureFixture) -> None:
    """...and the store says which job the database refused, once per job and error."""

    async def go() -> None:
        store = Store(store_db)
        await store.open()
        await store.save_hello(hello(), 1.0)

        def broken(conn: Conn) -> None:
            conn.execute("INSERT INTO nodes (name) VALUES ('x')")  # violates NOT NULL

        with caplog.at_level(logging.DEBUG, "gpufleet.controller.store"):
            results = await asyncio.gather(
                store._thread.call(broken),
                store.save_frame(write(1)),
                store._thread.call(broken),
                return_exceptions=True,
            )
        assert isinstance(results[0], StoreUnavailable) and isinstance(results[2], StoreUnavailable), results
        said = [(r.levelno, r.getMessage()) for r in caplog.records if r.getMessage().startswith("store job")]
        assert [level for level, _ in said] == [logging.WARNING, logging.DEBUG], said
        assert "test_one_failing_job_does_not_undo_its_batch.<locals>.go.<locals>.broken failed" in said[0][1]
        assert "NULL" in said[0][1].upper(), said  # the database's own words (SQLite's, PostgreSQL's)
        fleet, _ = await store.load()
        store.close()
        assert fleet.acked[("n1", "b1")] == 1

    run(go())


def test_a_batch_settles_in_order_with_one_wake_up_of_the_loop(store_db: str) -> None:
    """Jobs queued while the store thread is busy run as one batch; their futures settle in the
    order queued (a failing one with its own error) from a single call_soon_threadsafe."""

    async def go() -> None:
        store = Store(store_db)
        await store.open()
        loop = asyncio.get_running_loop()
        wakeups: list[int] = []
        real = loop.call_soon_threadsafe

        def counted(callback: Any, *args: Any, **kwargs: Any) -> Any:
            wakeups.append(len(args[0]) if args and isinstance(args[0], list) else 1)
            return real(callback, *args, **kwargs)

        busy, release = threading.Event(), threading.Event()

        def hold(conn: Conn) -> None:
            busy.set()
            release.wait(10)

        held = store._thread.submit(hold)
        await asyncio.to_thread(busy.wait, 10)
        loop.call_soon_threadsafe = counted  # type: ignore[method-assign,assignment]
        settled: list[int] = []

        def job(i: int) -> Any:
            def fn(conn: Conn) -> int:
                if i == 5:
                    conn.execute("INSERT INTO nodes (name) VALUES ('x')")  # violates NOT NULL
                return i

            return fn

        futures = [store._thread.submit(job(i)) for i in range(10)]
        for i, future in enumerate(futures):

            def done(_: object, i: int = i) -> None:
                settled.append(i)

            future.add_done_callback(done)
        release.set()
        results = await asyncio.gather(*futures, return_exceptions=True)
        await held
        loop.call_soon_threadsafe = real  # type: ignore[method-assign]
        store.close()
        assert wakeups == [1, 10]  # the held job's own batch, then the ten together
        assert settled == list(range(10))
        assert isinstance(results[5], StoreUnavailable), results[5]
        assert [r for i, r in enumerate(results) if i != 5] == [i for i in range(10) if i != 5]

    run(go())


def test_with_a_commit_interval_jobs_that_come_within_it_share_one_transaction(store_db: str) -> None:
    """db_commit_interval_seconds: after a transaction begins, the next begins only once the interval
    has passed, with every job queued by then; each job still settles only after its commit. Without
    the interval, jobs that come 30 ms apart do not wait for each other."""

    async def batches(interval: float) -> list[int]:
        store = Store(store_db, commit_interval_seconds=interval)
        await store.open()
        await store.save_hello(hello(), 1.0)
        await store.save_frame(write(1))  # a transaction just began: the next waits for the interval
        loop = asyncio.get_running_loop()
        sizes: list[int] = []
        real = loop.call_soon_threadsafe

        def counted(callback: Any, *args: Any, **kwargs: Any) -> Any:
            sizes.append(len(args[0]))
            return real(callback, *args, **kwargs)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign,assignment]
        saves = []
        for seq in range(2, 7):
            saves.append(asyncio.ensure_future(store.save_frame(write(seq))))
            await asyncio.sleep(0.03)
            assert interval == 0 or not any(s.done() for s in saves)  # none acked before its commit
        await asyncio.gather(*saves)
        loop.call_soon_threadsafe = real  # type: ignore[method-assign]
        fleet, _ = await store.load()
        store.close()
        assert fleet.acked[("n1", "b1")] == 6
        return sizes

    assert run(batches(1.0)) == [5]
    assert len(run(batches(0.0))) >= 2  # (a slow sync may join two of them)


def test_list_findings_filters(store_db: str) -> None:
    async def go() -> None:
        store = Store(store_db)
        await store.open()
        resolved = finding("n2")
        resolved.id, resolved.active = "id2", False
        await store.save_findings([finding()], [resolved])
        assert [f.id for f in await store.list_findings()] == ["id1"]
        assert {f.id for f in await store.list_findings(include_resolved=True)} == {"id1", "id2"}
        assert [f.id for f in await store.list_findings(node="n2", include_resolved=True)] == ["id2"]
        store.close()

    run(go())


def test_bmc_sample_is_stored_with_its_frame_and_reloads(store_db: str) -> None:
    path = store_db
    sample = bmc_sample(990.0)

    async def first() -> None:
        store = Store(path)
        await store.open()
        await store.save_hello(hello(), 1.0)
        with_bmc = write(1)
        with_bmc.bmc, with_bmc.bmc_time = sample, 990.0
        await store.save_frame(with_bmc)
        await store.save_frame(write(2))  # a frame without a BMC section keeps the stored one
        store.close()

    async def second() -> None:
        store = Store(path)
        await store.open()
        fleet, _ = await store.load()
        store.close()
        node = fleet.nodes["n1"]
        assert node.bmc == sample and node.bmc_time == 990.0
        assert node.bmc is not None and node.bmc.bios_pending["ProcCStates"] == "Enabled"
        assert node.host_time == 1002.0  # the frame's time, not the poll's

    run(first())
    run(second())


def test_finding_pages_come_in_the_operator_apis_order(store_db: str) -> None:
    """Text compares byte by byte on both backends (PostgreSQL's columns are COLLATE "C"), as
    controller/paging.py sorts in memory: a page boundary means the same thing in either."""
    nodes = ["b", "B", "a", "_z", "Zeta", "a-1", "a.1", "é"]

    async def go() -> None:
        store = Store(store_db)
        await store.open()
        rows = []
        for i, node in enumerate(nodes):
            row = finding(node)
            row.id = f"id{i}"
            rows.append(row)
        await store.save_findings(rows, [])
        everything = await store.list_findings_page("", False, None, None, 100)
        assert [finding_key(s) for s in everything] == sorted(finding_key(s) for s in rows)
        after = finding_key(everything[2])
        rest = await store.list_findings_page("", False, None, after, 100)
        assert [s.id for s in rest] == [s.id for s in everything[3:]]
        store.close()

    run(go())
