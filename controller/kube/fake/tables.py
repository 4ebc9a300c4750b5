"""Server-side printing: the meta.k8s.io/v1 Table kubectl asks for (`Accept: ...;as=Table`) so
`kubectl get nodes` shows STATUS (Ready,SchedulingDisabled), `get pods` READY and STATUS, `get lease`
HOLDER, as a cluster would."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

Column = tuple[str, str, int, Callable[[dict[str, Any]], Any]]  # name, type, priority, cell


def age(obj: dict[str, Any]) -> str:
    created = obj["metadata"].get("creationTimestamp")
    if not created:
        return "<unknown>"
    seconds = int(
        (datetime.now(UTC) - datetime.fromisoformat(created.replace("Z", "+00:00"))).total_seconds()
    )
    minutes, hours = seconds // 60, seconds // 3600
    if seconds < 0:
        return "0s"
    if seconds < 120:
        return f"{seconds}s"
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    return f"{hours // 24}d"


def _node_status(node: dict[str, Any]) -> str:
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next((c.get("status") for c in conditions if c.get("type") == "Ready"), None)
    text = {"True": "Ready", "False": "NotReady"}.get(ready or "", "Unknown")
    return text + (",SchedulingDisabled" if (node.get("spec") or {}).get("unschedulable") else "")


def _roles(node: dict[str, Any]) -> str:
    prefix = "node-role.kubernetes.io/"
    roles = [k[len(prefix) :] for k in node["metadata"].get("labels") or {} if k.startswith(prefix)]
    return ",".join(sorted(roles)) or "<none>"


def _pod_ready(pod: dict[str, Any]) -> str:
    containers = (pod.get("spec") or {}).get("containers") or []
    statuses = (pod.get("status") or {}).get("containerStatuses")
    if statuses is None:  # no kubelet here: a Running pod's containers count as ready
        ready = len(containers) if (pod.get("status") or {}).get("phase") == "Running" else 0
    else:
        ready = sum(bool(s.get("ready")) for s in statuses)
    return f"{ready}/{len(containers)}"


def _pod_status(pod: dict[str, Any]) -> str:
    if pod["metadata"].get("deletionTimestamp"):
        return "Terminating"
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _spec(field: str) -> Callable[[dict[str, Any]], Any]:
    return lambda obj: (obj.get("spec") or {}).get(field, "N/A")


COLUMNS: dict[str, list[Column]] = {
    "Node": [
        ("Status", "string", 0, _node_status),
        ("Roles", "string", 0, _roles),
        ("Age", "string", 0, age),
        (
            "Version",
            "string",
            0,
            lambda n: ((n.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion", ""),
        ),
    ],
    "Pod": [
        ("Ready", "string", 0, _pod_ready),
        ("Status", "string", 0, _pod_status),
        ("Restarts", "string", 0, lambda p: "0"),
        ("Age", "string", 0, age),
        ("IP", "string", 1, lambda p: (p.get("status") or {}).get("podIP") or "<none>"),
        ("Node", "string", 1, lambda p: (p.get("spec") or {}).get("nodeName") or "<none>"),
    ],
    "PodDisruptionBudget": [
        ("Min Available", "string", 0, _spec("minAvailable")),
        ("Max Unavailable", "string", 0, _spec("maxUnavailable")),
        ("Allowed Disruptions", "integer", 0, lambda p: (p.get("status") or {}).get("disruptionsAllowed", 0)),
        ("Age", "string", 0, age),
    ],
    "Lease": [  # as the API server prints them: NAME HOLDER AGE
        ("Holder", "string", 0, lambda lease: (lease.get("spec") or {}).get("holderIdentity") or ""),
        ("Age", "string", 0, age),
    ],
}


def of(kind: str, doc: dict[str, Any], include: str) -> dict[str, Any]:
    """The Table for a list or a single object."""
    if "items" in doc:
        return table(kind, doc["items"], doc.get("metadata") or {}, include)
    return table(kind, [doc], {"resourceVersion": doc["metadata"].get("resourceVersion", "")}, include)


def _name(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])


def table(kind: str, items: list[dict[str, Any]], list_meta: dict[str, Any], include: str) -> dict[str, Any]:
    columns: list[Column] = [("Name", "string", 0, _name), *COLUMNS.get(kind, [("Age", "string", 0, age)])]
    definitions = [
        {
            "name": name,
            "type": typ,
            "format": "name" if name == "Name" else "",
            "description": "",
            "priority": prio,
        }
        for name, typ, prio, _ in columns
    ]
    rows = [
        {"cells": [cell(obj) for *_, cell in columns], "object": _row_object(obj, include)} for obj in items
    ]
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": definitions,
        "rows": rows,
    }


def _row_object(obj: dict[str, Any], include: str) -> dict[str, Any] | None:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}


def wants_table(accept: str) -> bool:
    first = accept.split(",", maxsplit=1)[0]
    return "as=Table" in first
