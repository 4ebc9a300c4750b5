"""The fake kube-apiserver through the official `kubernetes` client, as the controller will use it:
nodes (patch, /status conditions by type, 409), pods by node, evictions under a PDB, DaemonSets,
leases, and injected failures surfacing as ApiException."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from controller.kube.fake import FakeApiServer
from controller.kube.fake.objects import daemon_set, node, pdb, pod, replica_set
from tests.kube.http_calls import web

BUDGET = "Cannot evict pod as it would violate the pod's disruption budget."


@pytest.fixture
def kube() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.add(node("n1"))
        server.add(node("n2"))
        yield server


def wire(model: Any) -> dict[str, Any]:
    """A model as its JSON (camelCase) dict, to index without a None check per level."""
    out: dict[str, Any] = model.to_dict(serialize=True)
    return out


def status_of(error: client.ApiException) -> dict[str, Any]:
    assert error.body is not None
    body: dict[str, Any] = json.loads(error.body)
    return body


@pytest.fixture
def api(kube: FakeApiServer) -> Iterator[client.ApiClient]:
    with client.ApiClient(client.Configuration(host=kube.url)) as api_client:
        yield api_client


def test_nodes_list_get_and_strategic_patch(kube: FakeApiServer, api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    assert [wire(n)["metadata"]["name"] for n in core.list_node().items] == ["n1", "n2"]
    taint = {"key": "gpufleet.io/unhealthy", "effect": "NoSchedule"}
    change = {
        "spec": {"unschedulable": True, "taints": [taint]},
        "metadata": {"labels": {"gpufleet.io/health": "bad"}},
    }
    patched = wire(core.patch_node("n1", change))
    assert patched["spec"]["unschedulable"] is True
    assert [(t["key"], t["effect"]) for t in patched["spec"]["taints"]] == [
        ("gpufleet.io/unhealthy", "NoSchedule")
    ]
    assert wire(core.read_node("n1"))["metadata"]["labels"]["gpufleet.io/health"] == "bad"
    assert ("PATCH", "/api/v1/nodes/n1") in kube.requests
    cleared = wire(core.patch_node("n1", {"spec": {"unschedulable": None, "taints": None}}))
    assert cleared["spec"]["unschedulable"] is None and cleared["spec"]["taints"] is None


def test_node_conditions_patched_through_status(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    condition = {"type": "GpuFleetHealthy", "status": "False", "reason": "SlowGpu", "message": "gpu 3 at 60%"}
    status = wire(core.patch_node_status("n1", {"status": {"conditions": [condition]}}))["status"]
    assert [(c["type"], c["status"]) for c in status["conditions"]] == [
        ("Ready", "True"),
        ("GpuFleetHealthy", "False"),
    ]
    healed = {**condition, "status": "True", "reason": "Healthy", "message": "within fleet normal"}
    status = wire(core.patch_node_status("n1", {"status": {"conditions": [healed]}}))["status"]
    assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == [
        ("Ready", "True", "KubeletReady"),
        ("GpuFleetHealthy", "True", "Healthy"),
    ]


def test_stale_resource_version_raises_409(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    n1 = core.read_node("n1")
    stale = wire(n1)["metadata"]["resourceVersion"]
    core.patch_node("n1", {"metadata": {"labels": {"a": "1"}}})
    with pytest.raises(client.ApiException) as replaced:
        core.replace_node("n1", n1)
    assert replaced.value.status == 409 and status_of(replaced.value)["reason"] == "Conflict"
    with pytest.raises(client.ApiException) as patched:
        core.patch_node("n1", {"metadata": {"resourceVersion": stale}, "spec": {"unschedulable": True}})
    assert patched.value.status == 409
    with pytest.raises(client.ApiException) as status:
        core.patch_node_status("n1", {"metadata": {"resourceVersion": stale}, "status": {}})
    assert status.value.status == 409
    fresh = core.read_node("n1")
    assert fresh.spec is not None
    fresh.spec.unschedulable = True
    assert wire(core.replace_node("n1", fresh))["spec"]["unschedulable"] is True


def test_pods_on_a_node_and_their_owners(kube: FakeApiServer, api: client.ApiClient) -> None:
    kube.add(replica_set("web-1", namespace="app"))
    kube.add(daemon_set("gpufleet-agent"))
    web(kube, "web-0")
    web(kube, "web-1", node_name="n2")
    kube.add(pod("agent-x", "n1", namespace="kube-system", owned_by=("DaemonSet", "gpufleet-agent")))
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    on_n1 = [wire(p) for p in core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1").items]
    assert [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in on_n1] == [
        ("app", "web-0"),
        ("kube-system", "agent-x"),
    ]
    owner = on_n1[1]["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["controller"]) == ("DaemonSet", True)
    ds = wire(apps.read_namespaced_daemon_set(owner["name"], "kube-system"))
    assert ds["metadata"]["uid"] == owner["uid"]
    assert [wire(r)["metadata"]["name"] for r in apps.list_namespaced_replica_set("app").items] == ["web-1"]
    created = wire(core.create_namespaced_pod("app", client.V1Pod(metadata=client.V1ObjectMeta(name="new"))))
    assert created["metadata"]["namespace"] == "app" and created["status"]["phase"] == "Running"


def test_eviction_blocked_by_a_pdb_then_allowed(kube: FakeApiServer, api: client.ApiClient) -> None:
    web(kube, "web-0", "web-1")
    kube.add(pdb("web-pdb", {"app": "web"}, namespace="app", min_available=2))
    core, policy = client.CoreV1Api(api), client.PolicyV1Api(api)
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name="web-0", namespace="app"))

    with pytest.raises(client.ApiException) as blocked:
        core.create_namespaced_pod_eviction("web-0", "app", eviction)
    assert blocked.value.status == 429
    body = status_of(blocked.value)
    assert body["message"] == BUDGET
    assert "web-pdb" in body["details"]["causes"][0]["message"]
    budget = wire(policy.read_namespaced_pod_disruption_budget("web-pdb", "app"))["status"]
    assert (budget["currentHealthy"], budget["desiredHealthy"], budget["disruptionsAllowed"]) == (2, 2, 0)

    kube.add(pod("web-2", "n2", namespace="app", labels={"app": "web"}, phase="Pending"))
    core.patch_namespaced_pod_status("web-2", "app", {"status": {"phase": "Running"}})
    core.create_namespaced_pod_eviction("web-0", "app", eviction)
    assert kube.get("Pod", "web-0", "app") is None
    assert ("POST", "/api/v1/namespaces/app/pods/web-0/eviction") in kube.requests


def test_graceful_delete_and_stuck_pod(kube: FakeApiServer, api: client.ApiClient) -> None:
    web(kube, "web-0")
    kube.stuck.add(("app", "web-0"))
    core = client.CoreV1Api(api)
    deleted = wire(core.delete_namespaced_pod("web-0", "app", grace_period_seconds=5))["metadata"]
    assert deleted["deletionTimestamp"] is not None and deleted["deletionGracePeriodSeconds"] == 5
    assert wire(core.read_namespaced_pod("web-0", "app"))["metadata"]["deletionTimestamp"] is not None
    kube.stuck.clear()
    with pytest.raises(client.ApiException) as gone:
        core.read_namespaced_pod("web-0", "app")
    assert gone.value.status == 404


def test_leases(api: client.ApiClient) -> None:
    coordination = client.CoordinationV1Api(api)
    spec = client.V1LeaseSpec(holder_identity="replica-a", lease_duration_seconds=15)
    held = coordination.create_namespaced_lease(
        "kube-system", client.V1Lease(metadata=client.V1ObjectMeta(name="gpufleet"), spec=spec)
    )
    assert held.spec is not None
    held.spec.holder_identity = "replica-b"
    taken = wire(coordination.replace_namespaced_lease("gpufleet", "kube-system", held))
    assert taken["spec"]["holderIdentity"] == "replica-b"
    with pytest.raises(client.ApiException) as lost:
        coordination.replace_namespaced_lease("gpufleet", "kube-system", held)  # stale resourceVersion
    assert lost.value.status == 409
    read = wire(coordination.read_namespaced_lease("gpufleet", "kube-system"))
    assert read["metadata"]["resourceVersion"] == taken["metadata"]["resourceVersion"]
    coordination.delete_namespaced_lease("gpufleet", "kube-system")
    assert coordination.list_namespaced_lease("kube-system").items == []


def test_injected_failures_surface_as_api_exceptions(kube: FakeApiServer, api: client.ApiClient) -> None:
    kube.fail[("PATCH", r"^/api/v1/nodes/n1$")] = (503, 1)
    core = client.CoreV1Api(api)
    with pytest.raises(client.ApiException) as failed:
        core.patch_node("n1", {"spec": {"unschedulable": True}})
    assert failed.value.status == 503
    assert wire(core.patch_node("n1", {"spec": {"unschedulable": True}}))["spec"]["unschedulable"] is True
