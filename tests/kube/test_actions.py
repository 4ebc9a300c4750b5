"""The controller's cordon and uncordon (app.kube) against the fake API server: audited before
acting, cordon counted by the breaker and uncordon never, someone else's maintenance and cordon
respected, a node held by an agent's mutating command refused, and no cluster said in one line."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.app import ControllerApp
from controller.config import KubernetesConfig, MaintenanceConfig
from controller.errors import FailedPrecondition, NotFound
from controller.kube.cluster import NO_CLUSTER
from controller.kube.fake import FakeApiServer
from controller.kube.fake.objects import node, replica_set
from controller.store.audit import AuditEntry
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.harness import hello
from tests.kube.harness import audit, kube, run


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as s:
        for i in range(10):
            s.add(node(f"n{i}"))
        s.add(replica_set("web", replicas=3))
        yield s


def test_no_cluster_is_one_clear_line_and_audited(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    async def body(app: ControllerApp) -> None:
        assert not app.kube.enabled
        for action in (
            app.kube.cordon("n0", requester="t"),
            app.kube.uncordon("n0", requester="t"),
            app.kube.drain("n0", requester="t"),
        ):
            with pytest.raises(FailedPrecondition) as err:
                await action
            assert str(err.value) == NO_CLUSTER
        entries = await audit(app)
        assert sorted((e.action, e.outcome, e.detail) for e in entries) == [
            ("cordon", "refused", NO_CLUSTER),
            ("drain", "refused", NO_CLUSTER),
            ("uncordon", "refused", NO_CLUSTER),
        ]

    run(KubernetesConfig(), body)


def test_cordon_is_audited_first_and_counted_uncordon_is_recovery(
    tmp_path: Path, server: FakeApiServer
) -> None:
    async def body(app: ControllerApp) -> None:
        writes_before_audit: list[int] = []
        add_audit = app.store.add_audit

        async def spy(entry: AuditEntry) -> None:
            writes_before_audit.append(sum(1 for m, _ in server.requests if m != "GET"))
            await add_audit(entry)

        app.store.add_audit = spy  # type: ignore[method-assign]
        done, audit_id = await app.kube.cordon("n0", requester="operator:t", reason="slow gemm")
        assert done.changed and writes_before_audit == [0]  # the entry was stored before any write
        [entry] = await audit(app)
        assert (entry.id, entry.action, entry.outcome, entry.reason) == (
            audit_id,
            "cordon",
            "succeeded",
            "slow gemm",
        )
        assert [(a.kind, a.node, a.outcome) for a in app.breaker.state.actions] == [
            ("cordon", "n0", "succeeded")
        ]

        done, _ = await app.kube.uncordon("n0", requester="operator:t")
        assert done.changed
        assert len(app.breaker.state.actions) == 1  # recovery: never counted
        [entry] = await audit(app, "uncordon")
        assert (entry.outcome, entry.parameters["is_recovery"]) == ("succeeded", True)

        server_node = server.get("Node", "n1")
        assert server_node is not None
        server_node["spec"]["unschedulable"] = True  # kubectl cordon n1, by someone else
        server.replace(server_node)
        with pytest.raises(FailedPrecondition, match="cordoned by someone else"):
            await app.kube.uncordon("n1", requester="operator:t")
        assert sorted(e.outcome for e in await audit(app, "uncordon")) == ["refused", "succeeded"]
        done, _ = await app.kube.uncordon("n1", requester="operator:t", force=True)
        assert done.changed

        with pytest.raises(NotFound, match="no node 'nope'"):
            await app.kube.cordon("nope", requester="operator:t")

    run(kube(tmp_path, server), body)


def test_maintenance_is_left_alone(tmp_path: Path, server: FakeApiServer) -> None:
    n0 = server.get("Node", "n0")
    assert n0 is not None
    n0["metadata"]["annotations"] = {"example.com/maintenance": "ticket-7"}
    server.replace(n0)

    async def body(app: ControllerApp) -> None:
        for action in (
            app.kube.cordon("n0", requester="t"),
            app.kube.drain("n0", requester="t"),
            app.kube.uncordon("n0", requester="t"),
        ):
            with pytest.raises(FailedPrecondition, match="under someone else's maintenance") as err:
                await action
            assert "annotation example.com/maintenance=ticket-7" in str(err.value)
        assert [e.outcome for e in await audit(app)] == ["refused"] * 3
        assert not any(m != "GET" for m, _ in server.requests) and app.breaker.state.actions == ()

    run(kube(tmp_path, server, maintenance=MaintenanceConfig(annotations=["example.com/maintenance"])), body)


def test_a_mutating_agent_command_in_flight_holds_the_node(tmp_path: Path, server: FakeApiServer) -> None:
    async def body(app: ControllerApp) -> None:
        app.commands.open_stream(hello("n0", gpus=2), asyncio.Queue(), "ipv4:127.0.0.1:1")
        command = pb.Command(apply_profile=pb.ApplyProfile(profile="gpu-defaults"))
        record = await app.commands.issue("n0", command, "operator:t")
        for action in (app.kube.cordon("n0", requester="t"), app.kube.drain("n0", requester="t")):
            with pytest.raises(FailedPrecondition, match=f"mutating command in flight: {record.id}"):
                await action
        assert not any(m != "GET" for m, _ in server.requests)

    run(kube(tmp_path, server), body)
