"""The SQLite store on a real file: round trips, group commit, reload, and a full disk."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from controller.errors import StoreUnavailable
from controller.fleet.finding import Evidence, Finding
from controller.fleet.findings import StoredFinding
from controller.fleet.model import FrameWrite, GpuState, ProbeRecord
from controller.store.sqlite import Store
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.harness import bmc_sample

T = TypeVar("T")


def hello(node: str = "n1", boot: str = "b1") -> pb.Hello:
    msg = pb.Hello(node=node, boot_id=boot, agent_version="t")
    msg.inventory.gpus.add(index=0, uuid="GPU-1", name="NVIDIA H100 80GB HBM3")
    return msg


def write(seq: int, node: str = "n1", boot: str = "b1") -> FrameWrite:
    sample = pb.GpuSample(index=0, power_watts=500.0 + seq)
    result = pb.ProbeResult(probe="gemm", variant="bf16", gpu=0, value=700.0 + seq, unit="TFLOP/s")
    return FrameWrite(
        node,
        boot,
        seq,
        1000.0 + seq,
        gpus=[GpuState(0, sample, 1000.0 + seq, {"sw_power_cap": 1000.0})],
        host=pb.HostSample(load1=1.5),
        probes=[ProbeRecord(node, 0, "gemm", "bf16", 700.0 + seq, "TFLOP/s", 1000.0 + seq, result)],
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


def test_round_trip_and_reload(tmp_path: Path) -> None:
    path = str(tmp_path / "fleet.db")

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
        assert [a.finding for a in active] == [finding().finding]

    run(first())
    run(second())
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM probe_history").fetchone()[0] == 2


def test_concurrent_calls_commit_in_groups(tmp_path: Path) -> None:
    async def go() -> None:
        store = Store(str(tmp_path / "fleet.db"))
        await store.open()
        await store.save_hello(hello(), 1.0)
        await asyncio.gather(*(store.save_frame(write(seq)) for seq in range(1, 201)))
        fleet, _ = await store.load()
        store.close()
        assert fleet.acked[("n1", "b1")] in range(1, 201)

    run(go())


def test_one_failing_job_does_not_undo_its_batch(tmp_path: Path) -> None:
    async def go() -> None:
        store = Store(":memory:")
        await store.open()
        await store.save_hello(hello(), 1.0)

        def broken(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO nodes (name) VALUES ('x')")  # violates NOT NULL

        results = await asyncio.gather(
            store._thread.call(broken), store.save_frame(write(1)), return_exceptions=True
        )
        assert isinstance(results[0], (StoreUnavailable, sqlite3.Error))
        fleet, _ = await store.load()
        store.close()
        assert fleet.acked[("n1", "b1")] == 1

    run(go())


def test_full_disk_is_a_clear_error_and_the_store_recovers(tmp_path: Path) -> None:
    async def go() -> None:
        store = Store(str(tmp_path / "fleet.db"))
        await store.open()
        await store.save_hello(hello(), 1.0)
        # Cap the file at its current size: SQLite answers SQLITE_FULL as on a full disk.
        pages = await store._thread.call(lambda c: c.execute("PRAGMA page_count").fetchone()[0])
        await store._thread.call(lambda c: c.execute(f"PRAGMA max_page_count={pages}"))
        big = write(1)
        big.gpus[0].sample.uuid = "x" * 200_000
        with pytest.raises(StoreUnavailable, match="full"):
            await store.save_frame(big)
        fleet, _ = await store.load()
        assert ("n1", "b1") not in fleet.acked  # nothing half-stored
        await store._thread.call(lambda c: c.execute("PRAGMA max_page_count=1073741823"))
        await store.save_frame(big)
        fleet, _ = await store.load()
        store.close()
        assert fleet.acked[("n1", "b1")] == 1

    run(go())


def test_list_findings_filters(tmp_path: Path) -> None:
    async def go() -> None:
        store = Store(":memory:")
        await store.open()
        resolved = finding("n2")
        resolved.id, resolved.active = "id2", False
        await store.save_findings([finding()], [resolved])
        assert [f.id for f in await store.list_findings()] == ["id1"]
        assert {f.id for f in await store.list_findings(include_resolved=True)} == {"id1", "id2"}
        assert [f.id for f in await store.list_findings(node="n2", include_resolved=True)] == ["id2"]
        store.close()

    run(go())


def test_bmc_sample_is_stored_with_its_frame_and_reloads(tmp_path: Path) -> None:
    path = str(tmp_path / "fleet.db")
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


def test_a_file_written_before_bmc_state_existed_still_opens(tmp_path: Path) -> None:
    path = str(tmp_path / "fleet.db")

    async def older() -> None:
        store = Store(path)
        await store.open()
        await store.save_hello(hello(), 1.0)
        await store.save_frame(write(1))
        store.close()

    run(older())
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("DROP TABLE bmc_state")  # as a controller from before the BMC section left it
        conn.commit()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'bmc_state'").fetchone()[0] == 0

    async def newer() -> None:
        store = Store(path)
        await store.open()
        fleet, _ = await store.load()
        assert fleet.acked[("n1", "b1")] == 1 and fleet.nodes["n1"].bmc is None
        with_bmc = write(2)
        with_bmc.bmc, with_bmc.bmc_time = bmc_sample(1001.0), 1001.0
        await store.save_frame(with_bmc)
        fleet, _ = await store.load()
        store.close()
        assert fleet.nodes["n1"].bmc == bmc_sample(1001.0)

    run(newer())
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
