"""Tuning respects the other actors on a Kubernetes node: a node cordoned by someone else, under
someone else's maintenance, or held by a drain is not retuned (refused, audited, nothing sent),
while gpufleet's own cordon (drain, then retune) and a node the cluster lacks are fine."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from controller.config import MaintenanceConfig
from controller.kube.fake import FakeApiServer
from controller.kube.fake.objects import node
from controller.kube.nodes import CORDONED_BY
from protos.gpufleet.v1 import operator_pb2
from tests.controller.remediate.test_retune import agent, controller, fleet_of_five
from tests.controller.test_probe_node import status_of
from tests.kube.harness import kube


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as s:
        for i in range(5):
            s.add(node(f"n{i}"))
        yield s


def mark(
    server: FakeApiServer, name: str, annotations: dict[str, str], *, unschedulable: bool = False
) -> None:
    obj = server.get("Node", name)
    assert obj is not None
    obj["metadata"]["annotations"] = annotations
    obj["spec"]["unschedulable"] = unschedulable
    server.replace(obj)


def test_a_retune_respects_other_actors_on_the_node(tmp_path: Path, server: FakeApiServer) -> None:
    mark(server, "n0", {}, unschedulable=True)  # someone else's cordon: no gpufleet annotation
    mark(server, "n1", {"example.com/maintenance": "ticket-9"})
    mark(server, "n3", {CORDONED_BY: "gpufleet"}, unschedulable=True)  # ours: drained, now retuned
    cfg = kube(tmp_path, server, maintenance=MaintenanceConfig(annotations=["example.com/maintenance"]))

    async def go() -> None:
        async with (
            controller(kubernetes=cfg) as (running, stub),
            agent(running, "n0") as n0,
            agent(running, "n1") as n1,
            agent(running, "n2") as n2,
            agent(running, "n3") as n3,
        ):
            app = running.app
            await fleet_of_five(app)
            app.kube.busy["n2"] = "a drain is running"
            cases = {
                "n0": "node n0 is cordoned by someone else: gpufleet does not retune it",
                "n1": "node n1 is under someone else's maintenance (annotation example.com/maintenance",
                "n2": "node n2 is busy on Kubernetes: a drain is running",
            }
            for name, text in cases.items():
                request = operator_pb2.RetuneRequest(node=name, profile="gpu-defaults")
                got, details = await status_of(stub.Retune(request))
                assert got == grpc.StatusCode.FAILED_PRECONDITION and text in details, (name, details)
            assert n0.commands == n1.commands == n2.commands == []
            entries = await app.store.list_audit()
            assert sorted(e.node for e in entries if e.outcome == "refused") == ["n0", "n1", "n2"]
            answer = await stub.Retune(
                operator_pb2.RetuneRequest(node="n3", profile="gpu-defaults", wait=True)
            )
            assert answer.done and answer.result.state == "committed"
            assert len(n3.commands) == 1
            assert await app.kube.tuning_blocked("ghost") == ""  # not a Kubernetes node: nothing objects

    asyncio.run(go())
