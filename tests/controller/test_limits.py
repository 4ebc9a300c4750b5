"""limits.max_nodes over real gRPC streams, and the expiry of long-gone nodes
(limits.forget_after_seconds) with a fake clock and a real SQLite file."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path
from typing import Any

import grpc
import pytest

from controller.app import ControllerApp
from controller.config import DetectConfig, LimitsConfig
from controller.errors import ResourceExhausted
from controller.remediate.audit import Auditor
from controller.servicer import EOF
from protos.gpufleet.v1 import telemetry_pb2 as pb
from protos.gpufleet.v1 import telemetry_pb2_grpc
from tests.controller.harness import (
    T0,
    Clock,
    add_findings,
    as_frame,
    as_hello,
    config,
    frame,
    hello,
    running_controller,
    stored_finding,
)

StreamCall = grpc.aio.StreamStreamCall[pb.AgentMessage, pb.ControllerMessage]
DAY = 86400.0
NODE_TABLES = (
    "nodes",
    "boots",
    "gpu_state",
    "host_state",
    "bmc_state",
    "probe_results",
    "probe_history",
    "probe_series",
)


async def say_hello(channel: grpc.aio.Channel, node: str, boot: str = "b1") -> tuple[StreamCall, Any]:
    """Open a stream, send Hello and frame 1; the first reply (an ack) or the error that ended it."""
    call: StreamCall = telemetry_pb2_grpc.TelemetryStub(channel).Stream(None)
    await call.write(as_hello(hello(node, boot=boot)))
    await call.write(as_frame(frame(1, node, boot=boot)))
    try:
        return call, await call.read()
    except grpc.aio.AioRpcError as exc:
        return call, (exc.code(), exc.details())


def test_a_new_node_beyond_max_nodes_is_refused_and_known_ones_come_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def go() -> None:
        limits = LimitsConfig(max_nodes=2)
        async with (
            running_controller(config(limits=limits)) as running,
            grpc.aio.insecure_channel(running.address) as channel,
        ):
            a, first = await say_hello(channel, "a")
            b, second = await say_hello(channel, "b")
            assert first == second == pb.ControllerMessage(ack=pb.Ack(boot_id="b1", seq=1))
            with caplog.at_level(logging.WARNING, logger="gpufleet.controller.limits"):
                for name in ("c", "d", "c"):
                    _, refused = await say_hello(channel, name)
                    code, details = refused
                    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
                    assert "limit of 2 nodes (limits.max_nodes)" in details
            assert sorted(running.app.fleet.nodes) == ["a", "b"]
            assert running.app.ingest.node_limit.refused == 3
            logged = [r.getMessage() for r in caplog.records if r.name == "gpufleet.controller.limits"]
            assert logged == ["refused 1 Hello(s) from new nodes (latest 'c'): limits.max_nodes=2 reached"]

            await a.done_writing()  # a leaves, and comes back with a new boot: known, accepted
            assert await a.read() == EOF
            _, again = await say_hello(channel, "a", boot="b2")
            assert again == pb.ControllerMessage(ack=pb.Ack(boot_id="b2", seq=1))
            await b.done_writing()

    asyncio.run(go())


def test_a_burst_of_new_nodes_cannot_overshoot_max_nodes() -> None:
    async def go() -> None:
        async with running_controller(config(limits=LimitsConfig(max_nodes=3))) as running:
            results = await asyncio.gather(
                *(running.app.ingest.hello(hello(f"n{i}")) for i in range(10)), return_exceptions=True
            )
            assert [r for r in results if not isinstance(r, ResourceExhausted)] == [0, 0, 0]
            assert len(results) == 10
            assert len(running.app.fleet.nodes) == 3

    asyncio.run(go())


def rows(db: Path, node: str) -> dict[str, int]:
    """Rows about `node` in each table that names nodes."""
    tables = [(t, "node") for t in NODE_TABLES if t != "nodes"] + [("nodes", "name")]
    tables += [("findings", "node"), ("audit", "node")]
    conn = sqlite3.connect(db)
    try:
        return {
            t: conn.execute(f"SELECT count(*) FROM {t} WHERE {c} = ?", (node,)).fetchone()[0]
            for t, c in tables
        }
    finally:
        conn.close()


def test_nodes_gone_longer_than_forget_after_are_forgotten_once_audit_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "gpufleet.db"
    cfg = config(db=str(db), limits=LimitsConfig(forget_after_seconds=7 * DAY))

    async def go() -> None:
        clock = Clock()
        app = ControllerApp(cfg, clock=clock)
        await app.start()
        try:
            for name in ("gone", "silent-but-connected", "recent"):
                await app.ingest.hello(hello(name))
                assert await app.ingest.frame(name, frame(1, name)) == 1
            app.connected("silent-but-connected")
            await add_findings(app, [stored_finding("gone", 0, "power_cap", "warning")])
            await Auditor(app.store, clock).begin("operator:test", "probe_node", "gone")
            clock.now = T0 + 7 * DAY  # exactly the limit: not yet
            await app.ingest.hello(hello("recent", boot="b2"))
            assert await app.forget_gone() == []
            before = rows(db, "gone")
            assert all(before[t] >= 1 for t in ("nodes", "boots", "gpu_state", "probe_results", "findings"))

            clock.now = T0 + 7 * DAY + 1
            with caplog.at_level(logging.INFO, logger="gpufleet.controller"):
                assert await app.forget_gone() == ["gone"]
                assert await app.forget_gone() == []  # logged once, gone once
            assert sorted(app.fleet.nodes) == ["recent", "silent-but-connected"]
            assert not any(k[0] == "gone" for k in app.fleet.acked)
            assert not any(k[0] == "gone" for k in app.fleet.probes)
            assert not any(k[0] == "gone" for k in app.fleet.history)
            assert not any(k[0] == "gone" for k in app.active)
            assert "gone" not in app.ingest.last_frame
            assert "gone" not in app.ingest.state_saved and "gone" not in app.ingest.unsaved
            after = rows(db, "gone")
            assert {t: n for t, n in after.items() if n} == {"audit": 1}  # the audit log stays
            assert rows(db, "recent")["nodes"] == 1
            forgotten = [r.getMessage() for r in caplog.records if "forgetting node" in r.getMessage()]
            assert forgotten == [
                "forgetting node 'gone': not heard from for 604801 s (limits.forget_after_seconds 604800)"
            ]
        finally:
            app.close()
        again = ControllerApp(cfg, clock=clock)  # a restart does not bring it back
        await again.start()
        try:
            assert sorted(again.fleet.nodes) == ["recent", "silent-but-connected"]
            assert await again.ingest.hello(hello("gone")) == 0  # it may come back: a new node
            assert "gone" in again.fleet.nodes
        finally:
            again.close()

    asyncio.run(go())


def test_forget_after_zero_never_forgets_and_the_detection_loop_forgets(tmp_path: Path) -> None:
    async def go() -> None:
        clock = Clock()
        never = ControllerApp(config(limits=LimitsConfig(forget_after_seconds=0)), clock=clock)
        await never.start()
        try:
            await never.ingest.hello(hello("old"))
            clock.now = T0 + 10_000 * DAY
            assert await never.forget_gone() == []
            assert "old" in never.fleet.nodes
        finally:
            never.close()

        clock.now = T0
        app = ControllerApp(config(limits=LimitsConfig(forget_after_seconds=60)), clock=clock)
        await app.start()
        try:
            await app.ingest.hello(hello("old"))
            clock.now = T0 + 61
            stop = asyncio.Event()
            loop = asyncio.create_task(app.detect_forever(stop))
            try:
                for _ in range(500):
                    if "old" not in app.fleet.nodes:
                        break
                    await asyncio.sleep(0.01)
                assert "old" not in app.fleet.nodes
            finally:
                stop.set()
                await loop
        finally:
            app.close()

    asyncio.run(go())


def test_the_hourly_prune_runs_beside_the_detection_passes_not_between_them() -> None:
    """An old store's prune is many jobs (controller/store/logged_history.py): the passes go on
    meanwhile, and a controller that stops cancels it."""

    async def go() -> None:
        app = ControllerApp(config(detect=DetectConfig(interval_seconds=0.01)), clock=Clock())
        await app.start()
        pruning, passes = asyncio.Event(), 0
        pass_once = app.detection_pass

        async def slow_prune(before: float) -> int:
            pruning.set()
            await asyncio.Event().wait()  # until cancelled
            return 0

        async def counted() -> object:
            nonlocal passes
            passes += 1
            return await pass_once()

        app.store.prune_history = slow_prune  # type: ignore[method-assign]
        app.detection_pass = counted  # type: ignore[method-assign,assignment]
        try:
            stop = asyncio.Event()
            loop = asyncio.create_task(app.detect_forever(stop))
            await asyncio.wait_for(pruning.wait(), 5)
            at_prune = passes
            for _ in range(500):
                if passes >= at_prune + 3:
                    break
                await asyncio.sleep(0.01)
            assert passes >= at_prune + 3
            stop.set()
            await asyncio.wait_for(loop, 5)  # the prune cancelled, not waited for
        finally:
            app.close()

    asyncio.run(go())
