"""The fake kube-apiserver over plain HTTP: discovery, selectors, evictions under PDBs, pod grace and
stuck pods, injected failures, leases and the Python-side API (add, get, objects, requests)."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from controller.kube.fake import FakeApiServer
from controller.kube.fake.objects import lease, node, pdb, pod, replica_set
from tests.kube.http_calls import MERGE, SMP, call, web

BUDGET = "Cannot evict pod as it would violate the pod's disruption budget."


@pytest.fixture
def kube() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.add(node("n1"))
        yield server


def test_discovery_names_the_resources_kubectl_needs(kube: FakeApiServer) -> None:
    code, core = call(kube, "GET", "/api/v1")
    assert code == 200 and core["groupVersion"] == "v1"
    by_name = {r["name"]: r for r in core["resources"]}
    assert by_name["pods/eviction"] | {"verbs": None} == {
        "name": "pods/eviction",
        "singularName": "",
        "namespaced": True,
        "group": "policy",
        "version": "v1",
        "kind": "Eviction",
        "verbs": None,
    }
    assert by_name["nodes"]["namespaced"] is False and "patch" in by_name["nodes/status"]["verbs"]
    assert by_name["pods"]["shortNames"] == ["po"]
    groups = {g["name"] for g in call(kube, "GET", "/apis")[1]["groups"]}
    assert groups == {"apps", "policy", "coordination.k8s.io"}
    assert {r["name"] for r in call(kube, "GET", "/apis/apps/v1")[1]["resources"]} >= {
        "daemonsets",
        "replicasets",
    }
    assert call(kube, "GET", "/version")[1]["gitVersion"].startswith("v1.")
    assert call(kube, "GET", "/api")[1]["versions"] == ["v1"]


def test_unknown_paths_answer_404_with_a_status(kube: FakeApiServer) -> None:
    for path in ("/openapi/v2", "/api/v1/widgets", "/apis/batch/v1", "/api/v1/pods/x"):
        code, body = call(kube, "GET", path)
        assert (code, body["kind"], body["reason"]) == (404, "Status", "NotFound"), path
    code, body = call(kube, "GET", "/api/v1/nodes/nope")
    assert (code, body["message"], body["details"]["kind"]) == (404, 'nodes "nope" not found', "nodes")


def test_selectors_filter_lists(kube: FakeApiServer) -> None:
    kube.add(node("n2", labels={"pool": "a100"}))
    web(kube, "web-0")
    web(kube, "web-1", node_name="n2")
    kube.add(pod("solo", "n1"))

    def names(path: str) -> list[str]:
        code, listed = call(kube, "GET", path)
        assert code == 200, listed
        return [o["metadata"]["name"] for o in listed["items"]]

    assert names("/api/v1/pods?fieldSelector=spec.nodeName%3Dn1") == ["web-0", "solo"]
    assert names("/api/v1/namespaces/app/pods?fieldSelector=spec.nodeName%3Dn1") == ["web-0"]
    assert names("/api/v1/pods?fieldSelector=spec.nodeName!%3Dn1,metadata.namespace%3Dapp") == ["web-1"]
    assert names("/api/v1/nodes?labelSelector=pool") == ["n2"]
    assert names("/api/v1/nodes?labelSelector=!pool") == ["n1"]
    assert names("/api/v1/nodes?labelSelector=pool%20in%20(a100,h100),kubernetes.io/hostname%3Dn2") == ["n2"]
    assert names("/api/v1/nodes?labelSelector=pool%20notin%20(a100)") == ["n1"]
    assert names("/api/v1/nodes?fieldSelector=metadata.name%3Dn2") == ["n2"]
    code, body = call(kube, "GET", "/api/v1/pods?fieldSelector=spec.color%3Dred")
    assert (code, body["message"]) == (400, "field label not supported: spec.color")


def test_eviction_without_a_pdb_deletes_the_pod(kube: FakeApiServer) -> None:
    web(kube, "web-0")
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "web-0", "namespace": "app"},
    }
    code, body = call(kube, "POST", "/api/v1/namespaces/app/pods/web-0/eviction", eviction)
    assert (code, body["kind"], body["status"]) == (201, "Status", "Success")
    assert kube.get("Pod", "web-0", "app") is None
    assert call(kube, "POST", "/api/v1/namespaces/app/pods/web-0/eviction", eviction)[0] == 404
    wrong = {**eviction, "metadata": {"name": "other"}}
    web(kube, "web-1")
    assert call(kube, "POST", "/api/v1/namespaces/app/pods/web-1/eviction", wrong)[0] == 400


def test_eviction_under_a_pdb_answers_429_until_another_pod_runs(kube: FakeApiServer) -> None:
    web(kube, "web-0", "web-1")
    kube.add(pdb("web-pdb", {"app": "web"}, namespace="app", min_available=2))
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "web-0", "namespace": "app"},
    }

    code, body = call(kube, "POST", "/api/v1/namespaces/app/pods/web-0/eviction", eviction)
    assert (code, body["reason"], body["message"]) == (429, "TooManyRequests", BUDGET)
    assert body["details"]["causes"] == [
        {
            "reason": "DisruptionBudget",
            "message": "The disruption budget web-pdb needs 2 healthy pods and has 2 currently",
        }
    ]
    assert kube.get("Pod", "web-0", "app") is not None

    kube.add(pod("web-2", "n1", namespace="app", labels={"app": "web"}, phase="Pending"))
    assert call(kube, "POST", "/api/v1/namespaces/app/pods/web-0/eviction", eviction)[0] == 429
    code, _ = call(
        kube, "PATCH", "/api/v1/namespaces/app/pods/web-2/status", {"status": {"phase": "Running"}}, SMP
    )
    assert code == 200
    status = (kube.get("PodDisruptionBudget", "web-pdb", "app") or {})["status"]
    assert (status["currentHealthy"], status["disruptionsAllowed"], status["expectedPods"]) == (3, 1, 3)
    assert call(kube, "POST", "/api/v1/namespaces/app/pods/web-0/eviction", eviction)[0] == 201
    assert (
        call(kube, "POST", "/api/v1/namespaces/app/pods/web-1/eviction", eviction | {"metadata": {}})[0]
        == 429
    )


def test_pdb_max_unavailable_and_percentages(kube: FakeApiServer) -> None:
    web(kube, "web-0", "web-1", "web-2", "web-3")
    kube.add(pdb("by-max", {"app": "web"}, namespace="app", max_unavailable=1))
    status = (kube.get("PodDisruptionBudget", "by-max", "app") or {})["status"]
    assert (status["desiredHealthy"], status["disruptionsAllowed"]) == (3, 1)
    kube.add(pdb("by-percent", {"app": "web"}, namespace="app", min_available="50%"))
    status = (kube.get("PodDisruptionBudget", "by-percent", "app") or {})["status"]
    assert (status["desiredHealthy"], status["disruptionsAllowed"]) == (2, 2)
    code, body = call(kube, "POST", "/api/v1/namespaces/app/pods/web-0/eviction", {"kind": "Eviction"})
    assert code == 500 and "more than one PodDisruptionBudget" in body["message"]


def test_pod_grace_and_stuck_pods() -> None:
    with FakeApiServer(pod_grace_seconds=0.3) as kube:
        web(kube, "web-0", "web-1")
        kube.stuck.add(("app", "web-1"))
        for name in ("web-0", "web-1"):
            code, gone = call(kube, "DELETE", f"/api/v1/namespaces/app/pods/{name}")
            assert code == 200 and gone["metadata"]["deletionTimestamp"]
            assert gone["metadata"]["deletionGracePeriodSeconds"] == 30
        code, listed = call(kube, "GET", "/api/v1/namespaces/app/pods")
        assert [p["metadata"]["name"] for p in listed["items"]] == ["web-0", "web-1"]
        time.sleep(0.4)
        assert [p["metadata"]["name"] for p in kube.objects("Pod", "app")] == ["web-1"]
        kube.stuck.clear()
        assert kube.objects("Pod", "app") == []
        web(kube, "web-2")
        assert call(kube, "DELETE", "/api/v1/namespaces/app/pods/web-2?gracePeriodSeconds=0")[0] == 200
        assert kube.get("Pod", "web-2", "app") is None  # grace 0: gone at once


def test_injected_failures_then_normal_again(kube: FakeApiServer) -> None:
    kube.fail[("GET", r"^/api/v1/nodes/n1$")] = (503, 2)
    kube.fail[("PATCH", r"/nodes/")] = (500, 1)
    assert [call(kube, "GET", "/api/v1/nodes/n1")[0] for _ in range(3)] == [503, 503, 200]
    assert call(kube, "GET", "/api/v1/nodes")[0] == 200
    assert call(kube, "PATCH", "/api/v1/nodes/n1", {}, SMP)[0] == 500
    assert call(kube, "PATCH", "/api/v1/nodes/n1", {}, SMP)[0] == 200
    assert kube.fail == {}
    assert kube.requests[-2:] == [("PATCH", "/api/v1/nodes/n1"), ("PATCH", "/api/v1/nodes/n1")]


def test_leases_crud(kube: FakeApiServer) -> None:
    base = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"
    code, held = call(kube, "POST", base, lease("gpufleet-controller", "replica-a"))
    assert code == 201 and held["metadata"]["namespace"] == "kube-system"
    assert call(kube, "POST", base, lease("gpufleet-controller", "replica-b"))[1]["reason"] == "AlreadyExists"
    held["spec"]["holderIdentity"] = "replica-b"
    code, taken = call(kube, "PUT", f"{base}/gpufleet-controller", held)
    assert code == 200 and taken["spec"]["holderIdentity"] == "replica-b"
    assert call(kube, "PUT", f"{base}/gpufleet-controller", held)[0] == 409
    renew = {"spec": {"renewTime": "2025-01-01T00:00:00.000000Z"}}
    assert call(kube, "PATCH", f"{base}/gpufleet-controller", renew, MERGE)[1]["spec"]["renewTime"]
    assert [x["metadata"]["name"] for x in call(kube, "GET", base)[1]["items"]] == ["gpufleet-controller"]
    code, body = call(kube, "DELETE", f"{base}/gpufleet-controller")
    assert (code, body["status"]) == (200, "Success")
    assert call(kube, "GET", f"{base}/gpufleet-controller")[0] == 404


def test_python_side_api(kube: FakeApiServer) -> None:
    stored = kube.add(replica_set("web-1", namespace="app"))
    meta = stored["metadata"]
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z") and meta["generation"] == 1
    version = int(meta["resourceVersion"])
    bare = kube.add({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}})
    assert bare["metadata"]["namespace"] == "default" and bare["status"]["phase"] == "Running"
    assert int(bare["metadata"]["resourceVersion"]) > version
    web(kube, "web-0")
    ref = (kube.get("Pod", "web-0", "app") or {})["metadata"]["ownerReferences"][0]
    assert ref["uid"] == meta["uid"]  # completed from the stored owner
    with pytest.raises(ValueError, match="already exists"):
        kube.add(node("n1"))
    with pytest.raises(ValueError, match="holds no kind"):
        kube.add({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}})
    assert kube.get("Pod", "p") is not None and kube.get("Pod", "p", "app") is None
    assert [p["metadata"]["name"] for p in kube.objects("Pod")] == ["web-0", "p"]
    assert {n["metadata"]["name"] for n in kube.objects("Namespace")} == {"default", "kube-system", "app"}
    running = kube.replace({**bare, "status": {"phase": "Succeeded"}})
    assert running["status"]["phase"] == "Succeeded"
    assert kube.requests == []  # none of this went over HTTP
    url = kube.url
    kube.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url + "/version", timeout=2)
