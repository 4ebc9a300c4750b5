"""Builders for the objects a test or the demo puts in the fake: nodes, pods (owned by a
ReplicaSet or DaemonSet, bare or mirror), their owners, PodDisruptionBudgets and leases."""

from __future__ import annotations

from typing import Any

from controller.kube.fake.store import timestamp

MIRROR = "kubernetes.io/config.mirror"


def node(
    name: str, *, ready: bool = True, gpus: int = 0, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    now = timestamp()
    condition = {
        "type": "Ready",
        "status": "True" if ready else "False",
        "reason": "KubeletReady" if ready else "KubeletNotReady",
        "message": "kubelet is posting ready status" if ready else "container runtime is down",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", "ephemeral-storage": "1Ti"}
    if gpus:
        capacity["nvidia.com/gpu"] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {},
        "status": {
            "conditions": [condition],
            "capacity": capacity,
            "allocatable": dict(capacity),
            "nodeInfo": {"kubeletVersion": "v1.32.4"},  # the rest is filled in by the server
        },
    }


def owner(kind: str, name: str) -> dict[str, Any]:
    """A controller owner reference (`controller: true`, what kubectl drain looks for)."""
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "name": name,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def pod(
    name: str,
    node_name: str,
    *,
    namespace: str = "default",
    owned_by: tuple[str, str] | None = None,  # ("ReplicaSet", "web-5d9f"), ("DaemonSet", "agent")
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    phase: str = "Running",
    empty_dir: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels or {})}
    if annotations:
        meta["annotations"] = dict(annotations)
    if owned_by:
        meta["ownerReferences"] = [owner(*owned_by)]
    spec: dict[str, Any] = {"nodeName": node_name, "containers": [{"name": "main", "image": "pause:3.10"}]}
    if empty_dir:
        spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": phase}}


def mirror_pod(name: str, node_name: str, *, namespace: str = "kube-system") -> dict[str, Any]:
    """A static pod's mirror, as the kubelet creates it (kubectl drain leaves it alone)."""
    return pod(name, node_name, namespace=namespace, annotations={MIRROR: "0123456789abcdef"})


def replica_set(name: str, *, namespace: str = "default", replicas: int = 1) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}},
        },
    }


def daemon_set(name: str, *, namespace: str = "kube-system") -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}}},
    }


def pdb(
    name: str,
    match_labels: dict[str, str],
    *,
    namespace: str = "default",
    min_available: int | str | None = None,
    max_unavailable: int | str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": {"matchLabels": dict(match_labels)}}
    if min_available is not None:
        spec["minAvailable"] = min_available
    if max_unavailable is not None:
        spec["maxUnavailable"] = max_unavailable
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def lease(
    name: str, holder: str, *, namespace: str = "kube-system", duration_seconds: int = 15
) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration_seconds},
    }
