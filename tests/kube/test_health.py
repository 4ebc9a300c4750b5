"""Node health on the Node object against the fake API server: the GpuFleetHealthy condition
(through nodes/status), the gpufleet.io/health label and, when the config says so, the
gpufleet.io/unhealthy taint; patched only on change, a 409 retried; and the fleet's health as the
publisher puts it there after a detection pass."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.config import KubernetesConfig, MaintenanceConfig
from controller.fleet.finding import Evidence, Finding
from controller.fleet.findings import StoredFinding
from controller.fleet.model import Fleet, NodeState
from controller.kube.api import KubeApi
from controller.kube.cluster import find_cluster
from controller.kube.fake import FakeApiServer
from controller.kube.fake.objects import node
from controller.kube.health import CONDITION, HEALTH_LABEL, TAINT_KEY, Health, set_health
from controller.kube.publish import HealthPublisher
from tests.controller.harness import hello
from tests.kube.harness import T0, api_for, kubeconfig

UNHEALTHY = Health("unhealthy", "Unhealthy", "1 active finding(s): nvlink_down (critical)")
HEALTHY = Health("healthy", "Healthy", "no active gpufleet findings")


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as s:
        s.add(node("n1"))
        s.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"}, "spec": {}})
        yield s


@pytest.fixture
def api(tmp_path: Path, server: FakeApiServer) -> KubeApi:
    return api_for(tmp_path, server)


def the_node(server: FakeApiServer, name: str = "n1") -> dict[str, Any]:
    found = server.get("Node", name)
    assert found is not None
    return found


def condition(server: FakeApiServer, name: str = "n1") -> dict[str, Any]:
    found = [c for c in the_node(server, name)["status"].get("conditions") or [] if c["type"] == CONDITION]
    assert len(found) == 1
    return dict(found[0])


def taints(server: FakeApiServer, name: str = "n1") -> list[dict[str, Any]]:
    return list(the_node(server, name)["spec"].get("taints") or [])


def test_condition_label_and_taint_follow_the_health(server: FakeApiServer, api: KubeApi) -> None:
    other = {"key": "example.com/gpu", "value": "a100", "effect": "NoSchedule"}
    api.patch_node("n1", {"spec": {"taints": [other]}})  # someone else's taint stays
    assert set_health(api, "n1", UNHEALTHY, taint=True, now=T0)
    c = condition(server)
    assert (c["status"], c["reason"], c["message"]) == ("False", "Unhealthy", UNHEALTHY.message)
    assert c["lastTransitionTime"] == "2027-01-15T08:00:00Z" == c["lastHeartbeatTime"]
    assert the_node(server)["metadata"]["labels"][HEALTH_LABEL] == "unhealthy"
    assert taints(server) == [other, {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}]
    ready = [c for c in the_node(server)["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True"  # conditions merge by type: the kubelet's stay

    start = len(server.requests)
    assert not set_health(api, "n1", UNHEALTHY, taint=True, now=T0 + 60)  # unchanged: no patch
    assert all(m == "GET" for m, _ in server.requests[start:])

    assert set_health(api, "n1", HEALTHY, taint=True, now=T0 + 120)
    c = condition(server)
    assert (c["status"], c["reason"]) == ("True", "Healthy")
    assert c["lastTransitionTime"] == "2027-01-15T08:02:00Z"
    assert the_node(server)["metadata"]["labels"][HEALTH_LABEL] == "healthy"
    assert taints(server) == [other]


def test_degraded_keeps_the_transition_time_and_no_taint_without_config(
    server: FakeApiServer, api: KubeApi
) -> None:
    set_health(api, "n1", Health("degraded", "Degraded", "a"), taint=False, now=T0)
    set_health(api, "n1", Health("degraded", "Degraded", "b"), taint=False, now=T0 + 10)
    c = condition(server)
    assert (c["status"], c["message"], c["lastTransitionTime"]) == ("False", "b", "2027-01-15T08:00:00Z")
    set_health(api, "n1", UNHEALTHY, taint=False, now=T0 + 20)
    assert taints(server) == []  # taint_unhealthy is off
    assert condition(server)["lastTransitionTime"] == "2027-01-15T08:00:00Z"  # still False


def test_a_silent_node_gets_unknown_and_keeps_its_label(server: FakeApiServer, api: KubeApi) -> None:
    set_health(api, "n1", UNHEALTHY, taint=True, now=T0)
    set_health(api, "n1", Health("unknown", "AgentSilent", "no telemetry"), taint=True, now=T0 + 5)
    assert condition(server)["status"] == "Unknown"
    assert the_node(server)["metadata"]["labels"][HEALTH_LABEL] == "unhealthy"
    assert [t["key"] for t in taints(server)] == [TAINT_KEY]


def test_a_conflict_is_retried_on_both_the_node_and_its_status(server: FakeApiServer, api: KubeApi) -> None:
    server.fail[("PATCH", r"^/api/v1/nodes/n1$")] = (409, 1)
    server.fail[("PATCH", r"^/api/v1/nodes/n1/status$")] = (409, 1)
    assert set_health(api, "n1", UNHEALTHY, taint=True, now=T0)
    patches = [p.split("?")[0] for m, p in server.requests if m == "PATCH"]
    assert patches == ["/api/v1/nodes/n1"] * 2 + ["/api/v1/nodes/n1/status"] * 2
    assert condition(server)["status"] == "False"
    assert the_node(server)["metadata"]["labels"][HEALTH_LABEL] == "unhealthy"
    assert [t["key"] for t in taints(server)] == [TAINT_KEY]


def test_a_node_under_maintenance_gets_no_taint(server: FakeApiServer, api: KubeApi) -> None:
    api.patch_node("n1", {"metadata": {"labels": {"maintenance": "true"}}})
    away = MaintenanceConfig(labels=["maintenance"])
    set_health(api, "n1", UNHEALTHY, taint=True, now=T0, maintenance=away)
    assert taints(server) == [] and condition(server)["status"] == "False"


def stored(node: str, cause: str, severity: str) -> StoredFinding:
    finding = Finding(node, 0, cause, severity, f"{cause} on {node}", Evidence("m", 1.0))
    return StoredFinding(f"f-{node}-{cause}", finding, T0, T0)


def test_the_publisher_puts_the_fleets_health_on_changed_nodes(tmp_path: Path, server: FakeApiServer) -> None:
    config = KubernetesConfig(kubeconfig=str(kubeconfig(tmp_path, server)), taint_unhealthy=True)
    cluster = find_cluster(config, environ={})
    fleet = Fleet()
    for name in ("n1", "n2", "not-in-the-cluster"):
        fleet.nodes[name] = NodeState(name, hello(name), T0, T0, connected=True)
    publisher = HealthPublisher(config, cluster, clock=lambda: T0)

    async def rounds() -> None:
        publisher.after_pass(fleet, [stored("n1", "nvlink_down", "critical")], 60.0)
        assert publisher.task is not None
        await publisher.task
        start = len(server.requests)
        publisher.after_pass(fleet, [stored("n1", "nvlink_down", "critical")], 60.0)
        assert publisher.task.done() and len(server.requests) == start  # nothing changed: no call
        publisher.after_pass(fleet, [], 60.0)
        await publisher.task

    asyncio.run(rounds())
    assert condition(server, "n1")["status"] == "True" and taints(server, "n1") == []
    assert condition(server, "n2")["reason"] == "Healthy"
    assert publisher.published["not-in-the-cluster"].state == "healthy"  # a 404: skipped, remembered
