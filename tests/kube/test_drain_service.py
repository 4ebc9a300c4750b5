"""The controller's drains (app.kube) against the fake API server: counted by the breaker and
holding their node until they end, audited, refused before acting when the breaker or the pods say
no, planned by a dry run, and resumed by a restarted controller without evicting anything twice."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.app import ControllerApp
from controller.config import DrainConfig
from controller.errors import FailedPrecondition, InvalidMessage
from controller.kube.fake import FakeApiServer
from controller.kube.fake.objects import node, pdb, pod, replica_set
from controller.remediate.applying import BreakerRefused
from tests.kube.harness import WEB, FakeTime, audit, evictions, kube, run, started, web_pods


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as s:
        for i in range(10):
            s.add(node(f"n{i}"))
        s.add(replica_set("web", replicas=3))
        yield s


def test_a_drain_is_counted_holds_its_node_and_ends_audited(tmp_path: Path, server: FakeApiServer) -> None:
    web_pods(server, 2)
    server.stuck.add(("default", "web-1"))

    async def body(app: ControllerApp) -> None:
        record = await app.kube.drain("n0", requester="operator:t", reason="nvlink down", timeout=30)
        assert record.state == "running"
        [action] = app.breaker.state.actions
        assert (action.kind, action.node, action.outcome) == ("drain", "n0", "in_progress")
        for other in (
            app.kube.cordon("n0", requester="t"),
            app.kube.uncordon("n0", requester="t"),
            app.kube.drain("n0", requester="t"),
        ):
            with pytest.raises(FailedPrecondition, match=f"node n0 is busy: drain {record.id}"):
                await other
        await app.kube.wait(record, 30)
        assert record.state == "timed_out" and [p.key for p in record.waiting] == ["default/web-1"]
        assert app.breaker.state.actions[0].outcome == "failed"
        entries = [e for e in await audit(app) if e.id == record.audit_id]
        assert entries[0].outcome == "failed" and entries[0].detail.startswith("timed_out: timed out (30s)")
        assert (await app.store.list_drains("n0"))[0].state == "timed_out"

        with pytest.raises(InvalidMessage, match="timeout_seconds"):
            await app.kube.drain("n0", requester="t", timeout=-1)

    run(kube(tmp_path, server), body)


def test_the_breaker_refuses_a_second_drain_and_trips(tmp_path: Path, server: FakeApiServer) -> None:
    async def body(app: ControllerApp) -> None:
        first = await app.kube.drain("n0", requester="t")
        await app.kube.wait(first, 10)
        assert first.state == "drained"
        with pytest.raises(BreakerRefused, match="drain on n1 refused: 1 of 1 nodes already in action"):
            await app.kube.drain("n1", requester="t")
        assert app.breaker.state.tripped
        n1 = server.get("Node", "n1")
        assert n1 is not None and not n1["spec"].get("unschedulable")  # refused before anything acted

    run(kube(tmp_path, server), body, nodes=10)


def test_pods_it_may_not_evict_refuse_the_drain_before_it_acts(tmp_path: Path, server: FakeApiServer) -> None:
    server.add(pod("bare", "n0"))
    server.add(pod("cache", "n0", owned_by=WEB, empty_dir=True))

    async def body(app: ControllerApp) -> None:
        with pytest.raises(FailedPrecondition, match="drain of n0 refused: 2 pod") as err:
            await app.kube.drain("n0", requester="t")
        assert "default/bare" in str(err.value) and "default/cache" in str(err.value)
        assert not any(m != "GET" for m, _ in server.requests) and app.breaker.state.actions == ()
        assert [e.outcome for e in await audit(app)] == ["refused"]

    run(kube(tmp_path, server), body)


def test_a_dry_run_plans_and_changes_nothing(tmp_path: Path, server: FakeApiServer) -> None:
    web_pods(server, 2)

    async def body(app: ControllerApp) -> None:
        plan = await app.kube.drain("n0", requester="t", dry_run=True)
        assert plan.state == "planned" and [p.key for p in plan.pending] == ["default/web-0", "default/web-1"]
        assert not any(m != "GET" for m, _ in server.requests) and app.breaker.state.actions == ()
        [entry] = await audit(app)
        assert (entry.outcome, entry.parameters["dry_run"]) == ("succeeded", True)

    run(kube(tmp_path, server, drain=DrainConfig(timeout_seconds=60)), body)


def test_a_restarted_controller_resumes_the_drain_and_evicts_nothing_twice(
    tmp_path: Path, server: FakeApiServer
) -> None:
    web_pods(server, 3)
    budget = server.add(pdb("web-pdb", {"app": "web"}, min_available=2))
    server.stuck.add(("default", "web-0"))  # evicted, terminating when the controller stops
    cfg = kube(tmp_path, server)
    db = str(tmp_path / "c.db")
    time = FakeTime()

    async def first() -> str:
        app = await started(cfg, time, db)
        record = await app.kube.drain("n0", requester="operator:t", reason="xid 79")
        for _ in range(500):
            if "blocked by PDB" in record.progress and record.evicted:
                break
            await asyncio.sleep(0.01)
        assert "blocked by PDB web-pdb (default/web-1, default/web-2)" in record.progress
        tasks = list(app.kube.tasks.values())
        app.close()  # the controller stops mid-drain
        await asyncio.gather(*tasks, return_exceptions=True)
        return record.id

    drain_id = asyncio.run(first())
    assert evictions(server).count("default/web-0") == 1
    before = len(server.requests)

    async def second() -> None:
        app = await started(cfg, time, db)
        try:
            resumed = app.kube.drains["n0"]
            assert resumed.id == drain_id and resumed.state == "running"
            assert app.kube.busy["n0"] == f"drain {drain_id} is running"
            server.stuck.clear()
            budget["spec"] = {"maxUnavailable": 3, "selector": budget["spec"]["selector"]}
            server.replace(budget)
            await app.kube.wait(resumed, 30)
            assert resumed.state == "drained"
            assert [p.key for p in resumed.evicted] == ["default/web-0", "default/web-1", "default/web-2"]
            [action] = app.breaker.state.actions
            assert (action.kind, action.outcome) == ("drain", "succeeded")
            [entry] = [e for e in await audit(app) if e.id == resumed.audit_id]
            assert entry.outcome == "succeeded"
        finally:
            app.close()

    asyncio.run(second())
    after = [p for m, p in server.requests[before:] if m == "POST"]
    assert not any("/pods/web-0/" in p for p in after)  # evicted before the restart: never again
    assert evictions(server).count("default/web-0") == 1
