"""What the fake fills in on create, standing in for admission and the controllers it lacks: the
fields the official client's models require, a pod's phase (no kubelet: a pod runs at once) and
owner references completed from the stored owner."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from controller.kube.fake.resources import BY_KIND

Lookup = Callable[[str, str, str], dict[str, Any] | None]  # kind, namespace, name

_CONTAINER = {"name": "main", "image": "pause:3.10"}
_NODE_INFO = {  # every field is required by the client's V1NodeSystemInfo
    "architecture": "amd64",
    "bootID": "00000000-0000-0000-0000-000000000000",
    "containerRuntimeVersion": "containerd://1.7.24",
    "kernelVersion": "6.8.0",
    "kubeProxyVersion": "",
    "kubeletVersion": "v1.32.4",
    "machineID": "0" * 32,
    "operatingSystem": "linux",
    "osImage": "Ubuntu 24.04 LTS",
    "systemUUID": "00000000-0000-0000-0000-000000000000",
}


def _pod_spec(spec: dict[str, Any]) -> None:
    if not spec.get("containers"):
        spec["containers"] = [dict(_CONTAINER)]
    for c in spec["containers"]:
        c.setdefault("name", "main")
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("schedulerName", "default-scheduler")


def _owners(obj: dict[str, Any], lookup: Lookup) -> None:
    namespace = obj["metadata"].get("namespace", "")
    for ref in obj["metadata"].get("ownerReferences") or []:
        kind = ref.get("kind", "")
        owner = lookup(kind, namespace, ref.get("name", ""))
        if kind in BY_KIND:
            ref.setdefault("apiVersion", BY_KIND[kind].api_version)
        if owner is not None:
            ref.setdefault("uid", owner["metadata"]["uid"])
        ref.setdefault("uid", "00000000-0000-0000-0000-000000000000")


def fill(obj: dict[str, Any], lookup: Lookup) -> dict[str, Any]:
    kind = obj.get("kind")
    spec = obj.setdefault("spec", {}) if kind != "Namespace" else {}
    status = obj.setdefault("status", {})
    _owners(obj, lookup)
    if kind == "Node":
        info = status.setdefault("nodeInfo", {})
        for field, value in _NODE_INFO.items():
            info.setdefault(field, value)
    elif kind == "Pod":
        _pod_spec(spec)
        status.setdefault("phase", "Running")
    elif kind in ("DaemonSet", "ReplicaSet"):
        spec.setdefault("selector", {"matchLabels": {}})
        template = spec.setdefault("template", {})
        template.setdefault("metadata", {})
        _pod_spec(template.setdefault("spec", {}))
        if kind == "DaemonSet":
            for f in (
                "currentNumberScheduled",
                "desiredNumberScheduled",
                "numberMisscheduled",
                "numberReady",
            ):
                status.setdefault(f, 0)
        else:
            spec.setdefault("replicas", 1)
            status.setdefault("replicas", 0)
    elif kind == "Namespace":
        status.setdefault("phase", "Active")
    elif kind == "Lease":
        obj.pop("status")
    return obj
