"""Writes to the fake kube-apiserver: strategic merge (maps merged, taints replaced, conditions merged
by type, status only through /status), JSON merge and JSON patch, 409 on a stale resourceVersion,
dry runs; and the patch functions on their own."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from controller.kube.fake import FakeApiServer
from controller.kube.fake.objects import lease, node, pod
from controller.kube.fake.patch import MergeKeys, PatchError, json_patch, merge_patch, strategic_merge_patch
from tests.kube.http_calls import JSON_PATCH, MERGE, SMP, call


@pytest.fixture
def kube() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.add(node("n1"))
        yield server


def test_strategic_merge_patch_of_a_node(kube: FakeApiServer) -> None:
    patch = {
        "metadata": {
            "labels": {"gpufleet.io/health": "degraded"},
            "annotations": {"gpufleet.io/cordoned-by": "x"},
        },
        "spec": {"unschedulable": True, "taints": [{"key": "a", "effect": "NoSchedule"}]},
    }
    code, n1 = call(kube, "PATCH", "/api/v1/nodes/n1", patch, SMP)
    assert code == 200, n1
    assert n1["spec"] == {"unschedulable": True, "taints": [{"key": "a", "effect": "NoSchedule"}]}
    assert n1["metadata"]["labels"] == {"kubernetes.io/hostname": "n1", "gpufleet.io/health": "degraded"}
    taints = [{"key": "gpufleet.io/unhealthy", "effect": "NoSchedule"}]
    code, n1 = call(
        kube, "PATCH", "/api/v1/nodes/n1", {"spec": {"taints": taints, "unschedulable": None}}, SMP
    )
    assert n1["spec"] == {"taints": taints}  # the list is replaced, null removes
    code, n1 = call(
        kube,
        "PATCH",
        "/api/v1/nodes/n1",
        {"metadata": {"annotations": {"gpufleet.io/cordoned-by": None}}},
        SMP,
    )
    assert "annotations" not in n1["metadata"]


def test_conditions_merge_by_type_and_only_through_status(kube: FakeApiServer) -> None:
    ours = {"type": "GpuFleetHealthy", "status": "False", "reason": "SlowGpu", "message": "gpu 3 at 60%"}
    code, n1 = call(kube, "PATCH", "/api/v1/nodes/n1", {"status": {"conditions": [ours]}}, SMP)
    assert code == 200 and [c["type"] for c in n1["status"]["conditions"]] == ["Ready"]  # status ignored here
    code, n1 = call(kube, "PATCH", "/api/v1/nodes/n1/status", {"status": {"conditions": [ours]}}, SMP)
    assert code == 200, n1
    assert [c["type"] for c in n1["status"]["conditions"]] == ["Ready", "GpuFleetHealthy"]
    healed = {**ours, "status": "True", "reason": "Healthy"}
    code, n1 = call(kube, "PATCH", "/api/v1/nodes/n1/status", {"status": {"conditions": [healed]}}, SMP)
    assert n1["status"]["conditions"][1] == healed
    assert n1["status"]["conditions"][0]["status"] == "True"
    code, n1 = call(kube, "PATCH", "/api/v1/nodes/n1/status", {"spec": {"unschedulable": True}}, SMP)
    assert "unschedulable" not in n1["spec"]  # spec ignored through /status
    assert call(kube, "GET", "/api/v1/nodes/n1/status")[1]["status"]["conditions"][1] == healed


def test_merge_patch_and_json_patch(kube: FakeApiServer) -> None:
    code, n1 = call(
        kube, "PATCH", "/api/v1/nodes/n1", {"spec": {"taints": [{"key": "b", "effect": "NoExecute"}]}}, MERGE
    )
    assert code == 200 and n1["spec"]["taints"] == [{"key": "b", "effect": "NoExecute"}]
    ops = [
        {"op": "test", "path": "/spec/taints/0/key", "value": "b"},
        {"op": "add", "path": "/spec/taints/-", "value": {"key": "c", "effect": "NoSchedule"}},
        {"op": "replace", "path": "/spec/taints/0/effect", "value": "NoSchedule"},
        {"op": "add", "path": "/metadata/labels/gpufleet.io~1health", "value": "healthy"},
        {"op": "remove", "path": "/metadata/labels/kubernetes.io~1hostname"},
    ]
    code, n1 = call(kube, "PATCH", "/api/v1/nodes/n1", ops, JSON_PATCH)
    assert code == 200, n1
    assert [t["key"] + t["effect"] for t in n1["spec"]["taints"]] == ["bNoSchedule", "cNoSchedule"]
    assert n1["metadata"]["labels"] == {"gpufleet.io/health": "healthy"}
    code, body = call(
        kube,
        "PATCH",
        "/api/v1/nodes/n1",
        [{"op": "test", "path": "/spec/taints/0/key", "value": "z"}],
        JSON_PATCH,
    )
    assert (code, body["reason"]) == (422, "Invalid")
    code, body = call(kube, "PATCH", "/api/v1/nodes/n1", {"spec": {}}, "application/apply-patch+yaml")
    assert code == 415


def test_stale_resource_version_is_a_conflict_for_put_and_patch(kube: FakeApiServer) -> None:
    code, n1 = call(kube, "GET", "/api/v1/nodes/n1")
    old = n1["metadata"]["resourceVersion"]
    n1["metadata"]["labels"]["a"] = "1"
    code, updated = call(kube, "PUT", "/api/v1/nodes/n1", n1)
    assert code == 200 and int(updated["metadata"]["resourceVersion"]) > int(old)
    code, body = call(kube, "PUT", "/api/v1/nodes/n1", n1)  # still carries `old`
    assert (code, body["reason"], body["status"]) == (409, "Conflict", "Failure")
    assert body["message"].startswith(
        'Operation cannot be fulfilled on nodes "n1": the object has been modified'
    )
    stale = {"metadata": {"resourceVersion": old}, "spec": {"unschedulable": True}}
    assert call(kube, "PATCH", "/api/v1/nodes/n1", stale, SMP)[0] == 409
    assert call(kube, "PATCH", "/api/v1/nodes/n1/status", stale, MERGE)[0] == 409
    assert "unschedulable" not in (kube.get("Node", "n1") or {})["spec"]
    current = {
        "metadata": {"resourceVersion": updated["metadata"]["resourceVersion"]},
        "spec": {"unschedulable": True},
    }
    assert call(kube, "PATCH", "/api/v1/nodes/n1", current, SMP)[0] == 200
    del n1["metadata"]["resourceVersion"]  # unconditional update, as the real server allows
    assert call(kube, "PUT", "/api/v1/nodes/n1", n1)[0] == 200


def test_dry_run_changes_nothing(kube: FakeApiServer) -> None:
    version = (kube.get("Node", "n1") or {})["metadata"]["resourceVersion"]
    code, n1 = call(kube, "PATCH", "/api/v1/nodes/n1?dryRun=All", {"spec": {"unschedulable": True}}, SMP)
    assert code == 200 and n1["spec"]["unschedulable"] is True
    kube.add(pod("p", "n1"))
    dry = {"kind": "Eviction", "deleteOptions": {"dryRun": ["All"]}}
    assert call(kube, "POST", "/api/v1/namespaces/default/pods/p/eviction", dry)[0] == 201
    assert kube.get("Pod", "p") is not None
    after = kube.get("Node", "n1") or {}
    assert "unschedulable" not in after["spec"]
    assert after["metadata"]["resourceVersion"] == version


def test_finalizers_hold_a_deleted_object_and_generation_follows_the_spec(kube: FakeApiServer) -> None:
    held = lease("l", "a") | {"metadata": {"name": "l", "namespace": "default", "finalizers": ["x/hold"]}}
    kube.add(held)
    path = "/apis/coordination.k8s.io/v1/namespaces/default/leases/l"
    code, body = call(kube, "DELETE", path)
    assert code == 200 and body["metadata"]["deletionTimestamp"]
    assert call(kube, "GET", path)[0] == 200
    code, body = call(kube, "PATCH", path, {"spec": {"holderIdentity": "b"}}, MERGE)
    assert body["metadata"]["generation"] == 2
    assert call(kube, "PATCH", path, {"metadata": {"finalizers": None}}, MERGE)[0] == 200
    assert call(kube, "GET", path)[0] == 404
    code, n1 = call(kube, "PATCH", "/api/v1/nodes/n1/status", {"status": {"phase": "Running"}}, MERGE)
    assert n1["metadata"]["generation"] == 1  # status is not spec


def test_strategic_merge_directives() -> None:
    keys: MergeKeys = {("status", "conditions"): "type", ("metadata", "finalizers"): ""}
    doc: dict[str, Any] = {
        "metadata": {"finalizers": ["a", "b"], "labels": {"x": "1", "y": "2"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "Gone", "status": "False"}]},
    }
    change = {
        "metadata": {"$deleteFromPrimitiveList/finalizers": ["a"], "labels": {"$patch": "replace", "z": "3"}},
        "status": {
            "$setElementOrder/conditions": [{"type": "Ready"}, {"type": "New"}],
            "conditions": [{"type": "Gone", "$patch": "delete"}, {"type": "New", "status": "True"}],
        },
    }
    out = strategic_merge_patch(doc, change, keys)
    assert out == {
        "metadata": {"finalizers": ["b"], "labels": {"z": "3"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "New", "status": "True"}]},
    }
    assert doc["metadata"]["finalizers"] == ["a", "b"]  # the target is not changed
    assert strategic_merge_patch(doc, {"metadata": {"finalizers": ["c", "b"]}}, keys)["metadata"][
        "finalizers"
    ] == [
        "a",
        "b",
        "c",
    ]
    with pytest.raises(PatchError, match="merge key"):
        strategic_merge_patch(doc, {"status": {"conditions": [{"status": "True"}]}}, keys)


def test_merge_patch_and_json_patch_functions() -> None:
    assert merge_patch({"a": "b", "c": {"d": "e", "f": "g"}}, {"a": "z", "c": {"f": None}}) == {
        "a": "z",
        "c": {"d": "e"},
    }
    assert merge_patch({"a": [1, 2]}, {"a": [3]}) == {"a": [3]}
    doc = {"a": {"b": [1, 2]}, "c": 1}
    ops = [
        {"op": "add", "path": "/a/b/0", "value": 0},
        {"op": "copy", "from": "/a/b", "path": "/d"},
        {"op": "move", "from": "/c", "path": "/e"},
        {"op": "remove", "path": "/a/b/1"},
    ]
    assert json_patch(doc, ops) == {"a": {"b": [0, 2]}, "d": [0, 1, 2], "e": 1}
    assert doc == {"a": {"b": [1, 2]}, "c": 1}
    for bad in (
        [{"op": "remove", "path": "/nope"}],
        [{"op": "replace", "path": "/a/b/5", "value": 1}],
        [{"op": "test", "path": "/c", "value": 2}],
        [{"op": "frobnicate", "path": "/c"}],
        {"op": "add"},
    ):
        with pytest.raises(PatchError):
            json_patch(doc, bad)
