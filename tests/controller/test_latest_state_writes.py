"""A node's latest readings reach the store at most every db_state_seconds (issue 17's write
amplification), while ack positions and probe results are written with every frame; what memory holds
beyond the store is written at shutdown, and a failed write leaves it due again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import pytest

from controller.config import ControllerConfig
from controller.errors import StoreUnavailable
from controller.fleet.model import Fleet, NodeState
from controller.ingest import Ingest
from controller.store.store import Store
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.test_ingest import E, frame, hello


class Clock:
    def __init__(self) -> None:
        self.now = E + 5000.0

    def __call__(self) -> float:
        return self.now


def probed(seq: int) -> pb.TelemetryFrame:
    msg = frame(seq)
    msg.probes.add(probe="gemm", variant="bf16", unit="TFLOPS", value=700.0 + seq, gpu=0).time.FromSeconds(
        int(E + 1000 + seq)
    )
    return msg


def run(path: Path, body: Callable[[Ingest, Clock], Awaitable[None]], every: float = 60.0) -> None:
    async def go() -> None:
        store = Store(str(path))
        await store.open()
        clock = Clock()
        try:
            await body(Ingest(Fleet(), store, clock=clock, state_every_seconds=every), clock)
        finally:
            store.close()

    asyncio.run(go())


def stored(path: Path) -> Fleet:
    async def go() -> Fleet:
        store = Store(str(path))
        await store.open()
        try:
            return (await store.load())[0]
        finally:
            store.close()

    return asyncio.run(go())


def power(fleet: Fleet) -> float:
    return fleet.nodes["n1"].gpus[0].sample.power_watts


def test_readings_are_written_at_most_every_db_state_seconds_but_positions_and_probes_always(
    tmp_path: Path,
) -> None:
    db = tmp_path / "s.db"

    async def body(ingest: Ingest, clock: Clock) -> None:
        clock.now = E + 500  # the Hello comes before the frames' times
        await ingest.hello(hello())
        clock.now = E + 2000
        await ingest.frame("n1", frame(1))  # a new node's first readings are due at once
        for seq in (2, 3):
            clock.now += 10
            await ingest.frame("n1", probed(seq))
        await asyncio.sleep(0.05)  # the queued write settles

    run(db, body)
    fleet = stored(db)
    assert power(fleet) == 401.0  # frames 2 and 3 fell inside the 60 s
    assert fleet.acked[("n1", "b1")] == 3  # every position is stored
    assert fleet.probes[("n1", 0, "gemm", "bf16")].value == 703.0  # and every probe result
    assert [v for _, v in fleet.history[("n1", 0, "gemm", "bf16")]] == [702.0, 703.0]
    assert fleet.nodes["n1"].last_seen == E + 1003  # the newest frame's time, from its position

    async def later(ingest: Ingest, clock: Clock) -> None:
        ingest.fleet = (await ingest.store.load())[0]
        clock.now += 200  # past db_state_seconds since anything this Ingest wrote
        await ingest.frame("n1", frame(4))
        await asyncio.sleep(0.05)
        assert ingest.unsaved == set()

    run(db, later)
    assert power(stored(db)) == 404.0


def test_flush_writes_what_memory_holds_beyond_the_store(tmp_path: Path) -> None:
    db = tmp_path / "s.db"

    async def body(ingest: Ingest, clock: Clock) -> None:
        await ingest.hello(hello())
        for seq in (1, 2, 3):
            await ingest.frame("n1", frame(seq))
        assert ingest.unsaved == {"n1"}
        assert await ingest.flush_state() == 1
        assert ingest.unsaved == set() and await ingest.flush_state() == 0

    run(db, body)
    assert power(stored(db)) == 403.0


def test_zero_writes_the_readings_with_every_frame(tmp_path: Path) -> None:
    db = tmp_path / "s.db"

    async def body(ingest: Ingest, clock: Clock) -> None:
        await ingest.hello(hello())
        for seq in (1, 2):
            await ingest.frame("n1", frame(seq))
        assert ingest.unsaved == set()

    run(db, body, every=0)
    assert power(stored(db)) == 402.0


def test_a_failed_write_is_counted_and_due_again_with_the_next_frame(tmp_path: Path) -> None:
    db = tmp_path / "s.db"

    async def body(ingest: Ingest, clock: Clock) -> None:
        await ingest.hello(hello())
        real = ingest.store.queue_latest

        def broken(nodes: object, gpus: object = None) -> asyncio.Future[int]:
            future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            future.set_exception(StoreUnavailable("store unavailable: disk I/O error"))
            return future

        ingest.store.queue_latest = broken  # type: ignore[method-assign]
        await ingest.frame("n1", frame(1))  # acked: the position is stored, only the readings are not
        await asyncio.sleep(0.01)  # the write gathered at the end of the loop's turn, and its failure
        assert ingest.state_failures == 1 and ingest.unsaved == {"n1"}
        ingest.store.queue_latest = real  # type: ignore[method-assign]
        clock.now += 10  # well inside db_state_seconds: due again all the same
        await ingest.frame("n1", frame(2))
        await asyncio.sleep(0.05)
        assert ingest.unsaved == set()

    run(db, body)
    assert power(stored(db)) == 402.0


def test_db_state_seconds_is_bounded() -> None:
    assert ControllerConfig().db_state_seconds == 300.0
    with pytest.raises(ValueError, match="db_state_seconds"):
        ControllerConfig(db_state_seconds=-1)


def test_failed_writes_are_logged_once_then_every_thousandth(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def body(ingest: Ingest, clock: Clock) -> None:
        await ingest.hello(hello())

        def broken(nodes: object, gpus: object = None) -> asyncio.Future[int]:
            future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            future.set_exception(StoreUnavailable("store unavailable: database or disk is full"))
            return future

        ingest.store.queue_latest = broken  # type: ignore[method-assign]
        with caplog.at_level(logging.WARNING, logger="gpufleet.controller.ingest"):
            for seq in range(1, 1001):
                await ingest.frame("n1", frame(seq))
            await asyncio.sleep(0.01)  # the last write gathered, and its failure
        assert ingest.state_failures == 1000

    run(tmp_path / "s.db", body)
    lines = [r.getMessage() for r in caplog.records if "latest readings" in r.getMessage()]
    assert [line.split(" (")[1].split(";")[0] for line in lines] == [
        "1 such writes failed so far",
        "1000 such writes failed so far",
    ]


def test_readings_due_in_one_turn_of_the_loop_are_written_in_one_store_job(tmp_path: Path) -> None:
    """Frames whose writes one group commit acked resume together: the readings they made due go
    to the store in one job, not one job each."""
    db = tmp_path / "s.db"

    async def body(ingest: Ingest, clock: Clock) -> None:
        names = [f"n{i}" for i in range(1, 6)]
        for name in names:
            await ingest.hello(hello(name))
        real, jobs = ingest.store.queue_latest, []

        def counted(nodes: Sequence[NodeState], gpus: object = None) -> asyncio.Future[int]:
            jobs.append(sorted(n.name for n in nodes))
            return real(nodes, gpus)  # type: ignore[arg-type]

        ingest.store.queue_latest = counted  # type: ignore[method-assign]
        await asyncio.gather(*(ingest.frame(name, frame(1, name)) for name in names))
        await asyncio.sleep(0.05)
        assert jobs == [names] and ingest.unsaved == set()

    run(db, body)
    fleet = stored(db)
    assert [fleet.nodes[n].gpus[0].sample.power_watts for n in ("n1", "n5")] == [401.0, 401.0]
