"""The drain policy per cause (kubernetes.policy) against the fake API server: `off` recommends no
drain, `recommend` proposes one that `approve` starts (audited, as the operator's), `auto` drains
by itself within the breaker's budget (waiting, never tripping it) and the row follows the drain
(verified, needs_attention when blocked, failed when refused at its start), and without a cluster
`auto` is `recommend`, saying so."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.app import ControllerApp
from controller.config import DrainConfig, KubernetesConfig
from controller.errors import FailedPrecondition
from controller.kube.cluster import NO_CLUSTER
from controller.kube.fake import FakeApiServer
from controller.kube.fake.objects import node, pdb, pod, replica_set
from controller.kube.nodes import cordoned_by
from controller.operator_api import OperatorServicer
from controller.store.recommendations import Recommendation
from tests.controller.harness import add_findings, stored_finding
from tests.kube.harness import WEB, FakeTime, audit, evictions, kube, run, started, web_pods


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as s:
        for i in range(10):
            s.add(node(f"n{i}"))
        s.add(replica_set("web", replicas=3))
        yield s


async def nvlink_down(app: ControllerApp, *nodes: str) -> None:
    """An nvlink_down finding (a cause the map drains) on each node, then the tuning pass."""
    await add_findings(app, [stored_finding(n, None, "nvlink_down", "critical") for n in nodes])
    await app.tuning.after_pass()


def drain_rows(app: ControllerApp) -> dict[str, Recommendation]:
    return {r.node: r for r in app.tuning.recs.values() if r.action == "drain"}


def cordoned(server: FakeApiServer, name: str) -> str:
    obj = server.get("Node", name)
    assert obj is not None
    return cordoned_by(obj)


async def drained(app: ControllerApp, node: str) -> Recommendation:
    """Wait for the node's drain to end, then the pass that settles its row."""
    record = app.kube.drains[node]
    await app.kube.wait(record, 30)
    await app.tuning.after_pass()
    return drain_rows(app)[node]


def test_off_recommends_no_drain(tmp_path: Path, server: FakeApiServer) -> None:
    async def body(app: ControllerApp) -> None:
        await nvlink_down(app, "n0")
        assert app.tuning.recs == {}
        assert app.kube.drains == {} and await audit(app) == []

    run(kube(tmp_path, server, policy={"nvlink_down": "off"}, default_policy="auto"), body)


def test_recommend_proposes_and_approve_starts_the_drain(tmp_path: Path, server: FakeApiServer) -> None:
    web_pods(server, 2)

    async def body(app: ControllerApp) -> None:
        await nvlink_down(app, "n0")
        rec = drain_rows(app)["n0"]
        assert (rec.state, rec.policy, rec.requester) == ("proposed", "recommend", "")
        assert app.kube.drains == {} and cordoned(server, "n0") == ""  # nothing done by itself

        started = await app.tuning.approve(rec.id, requester="operator:t", reason="link 3 dark")
        record = app.kube.drains["n0"]
        assert (started.command.id, started.command.kind, started.audit_id) == (
            record.id,
            "drain",
            record.audit_id,
        )
        assert (rec.state, rec.command_id, rec.requester) == ("applying", record.id, "operator:t")
        await app.tuning.wait(started, 30)
        assert (rec.state, started.command.state) == ("verified", "succeeded")
        assert rec.detail == f"drain {record.id}: drained: 2 pod(s) evicted, 0 skipped"
        answer = await OperatorServicer(app)._answer(started, False, 0.0)  # what `gpufleet approve` gets
        assert (answer.done, answer.error, answer.command_id) == (True, "", record.id)
        assert not answer.HasField("result")  # a drain has no agent result: the CLI says drained
        assert evictions(server) == ["default/web-0", "default/web-1"]
        assert cordoned(server, "n0") == "gpufleet"
        [entry] = await audit(app, "drain")
        assert (entry.requester, entry.reason, entry.outcome) == ("operator:t", "link 3 dark", "succeeded")

        with pytest.raises(FailedPrecondition, match=f"recommendation {rec.id} is verified, not proposed"):
            await app.tuning.approve(rec.id, requester="operator:t", reason="")
        assert sorted(e.outcome for e in await audit(app, "drain")) == ["refused", "succeeded"]

    run(kube(tmp_path, server), body)


def test_approve_still_refuses_an_investigation(tmp_path: Path, server: FakeApiServer) -> None:
    async def body(app: ControllerApp) -> None:
        await add_findings(app, [stored_finding("n0", 0, "slow_unknown", "warning")])
        await app.tuning.after_pass()
        [rec] = app.tuning.recs.values()
        with pytest.raises(FailedPrecondition, match="is to investigate node n0: no setting fixes"):
            await app.tuning.approve(rec.id, requester="operator:t", reason="")
        assert app.kube.drains == {}

    run(kube(tmp_path, server, default_policy="auto"), body)


def test_auto_drains_within_the_breakers_budget_and_waits_rather_than_trip_it(
    tmp_path: Path, server: FakeApiServer
) -> None:
    web_pods(server, 1)
    server.add(pod("web-9", "n1", owned_by=WEB, labels={"app": "web"}))

    async def body(app: ControllerApp) -> None:
        await nvlink_down(app, "n0", "n1")
        rows = drain_rows(app)
        n0, n1 = rows["n0"], rows["n1"]
        assert (n0.state, n0.requester, n0.policy) == ("applying", "policy", "auto")
        assert n1.state == "approved"
        assert n1.detail == "waiting: the breaker's budget: 1 of 1 nodes in action fleet-wide"
        assert not app.breaker.state.tripped and "n1" not in app.kube.drains

        assert (await drained(app, "n0")).state == "verified"
        await app.tuning.after_pass()  # the window still holds n0's drain: n1 keeps waiting
        assert n1.state == "approved" and not app.breaker.state.tripped
        [entry] = await audit(app, "drain")
        assert (entry.node, entry.requester, entry.outcome) == ("n0", "policy", "succeeded")
        assert cordoned(server, "n1") == ""

    run(kube(tmp_path, server, default_policy="auto"), body, nodes=10)


def test_an_automatic_drain_blocked_by_a_pdb_needs_attention(tmp_path: Path, server: FakeApiServer) -> None:
    web_pods(server, 2)
    server.add(pdb("web-pdb", {"app": "web"}, min_available=2))
    cfg = kube(tmp_path, server, default_policy="auto", drain=DrainConfig(timeout_seconds=30))

    async def body(app: ControllerApp) -> None:
        await nvlink_down(app, "n0")
        rec = await drained(app, "n0")
        assert rec.state == "needs_attention"
        assert rec.detail.startswith(f"drain {rec.command_id}: blocked at the timeout (30s)")
        assert "blocked by PDB web-pdb" in rec.detail
        assert app.breaker.state.actions[0].outcome == "failed"  # told by the drain, once

    run(cfg, body)


def test_an_automatic_drain_refused_at_its_start_fails_its_row_once(
    tmp_path: Path, server: FakeApiServer
) -> None:
    server.add(pod("bare", "n0"))  # no controller: the config does not allow evicting it

    async def body(app: ControllerApp) -> None:
        await nvlink_down(app, "n0")
        rec = drain_rows(app)["n0"]
        assert rec.state == "failed" and rec.detail.startswith("not started: drain of n0 refused: 1 pod")
        await app.tuning.after_pass()  # the finding stays: not proposed again, not retried
        assert list(app.tuning.recs) == [rec.id] and rec.state == "failed"
        assert [e.outcome for e in await audit(app, "drain")] == ["refused"]
        assert app.breaker.state.actions == ()

    run(kube(tmp_path, server, default_policy="auto"), body)


def test_an_automatic_drain_waits_for_a_node_someone_else_holds(
    tmp_path: Path, server: FakeApiServer
) -> None:
    obj = server.get("Node", "n0")
    assert obj is not None
    obj["spec"]["unschedulable"] = True  # someone else's cordon
    server.replace(obj)

    async def body(app: ControllerApp) -> None:
        await nvlink_down(app, "n0")
        rec = drain_rows(app)["n0"]
        assert (rec.state, rec.detail) == ("approved", "waiting: node n0 is cordoned by someone else")
        assert await audit(app) == []

    run(kube(tmp_path, server, default_policy="auto"), body)


def test_without_a_cluster_auto_is_recommend_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    async def body(app: ControllerApp) -> None:
        await nvlink_down(app, "n0")
        rec = drain_rows(app)["n0"]
        assert (rec.state, rec.policy) == ("proposed", "auto")
        assert rec.detail == f"not drained automatically: {NO_CLUSTER}"
        with pytest.raises(FailedPrecondition, match=re.escape(f"is to drain node n0, but {NO_CLUSTER}")):
            await app.tuning.approve(rec.id, requester="operator:t", reason="")
        [entry] = await audit(app)
        assert (entry.action, entry.outcome, entry.node) == ("drain", "refused", "n0")
        assert rec.state == "proposed"

    run(KubernetesConfig(default_policy="auto"), body)


def test_a_restarted_controller_keeps_the_row_following_its_resumed_drain(
    tmp_path: Path, server: FakeApiServer
) -> None:
    web_pods(server, 1)
    server.stuck.add(("default", "web-0"))  # evicted, not gone when the controller stops
    cfg = kube(tmp_path, server, default_policy="auto")
    db, time = str(tmp_path / "c.db"), FakeTime()

    async def first() -> str:
        app = await started(cfg, time, db)
        await nvlink_down(app, "n0")
        record = app.kube.drains["n0"]
        for _ in range(500):
            if record.evicted:
                break
            await asyncio.sleep(0.01)
        tasks = list(app.kube.tasks.values())
        app.close()
        await asyncio.gather(*tasks, return_exceptions=True)
        return drain_rows(app)["n0"].id

    rec_id = asyncio.run(first())

    async def second() -> None:
        app = await started(cfg, time, db)
        try:
            rec = app.tuning.recs[rec_id]
            assert rec.state == "applying" and rec.command_id == app.kube.drains["n0"].id  # not concluded
            server.stuck.clear()
            assert (await drained(app, "n0")).state == "verified"
            assert [a.outcome for a in app.breaker.state.actions] == ["succeeded"]
        finally:
            tasks = list(app.kube.tasks.values())
            app.close()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(second())
