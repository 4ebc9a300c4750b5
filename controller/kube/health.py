"""A node's gpufleet health on its Node object: the condition `GpuFleetHealthy` (status, reason,
message; through nodes/status), the label `gpufleet.io/health=healthy|degraded|unhealthy` and,
when the config says so, the taint `gpufleet.io/unhealthy:NoSchedule` on an unhealthy node.

Each is patched only when it changes, through nodes.patch_node (409: read again, patch again).
A node whose agent went silent gets the condition `Unknown` and keeps its label and taint.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from controller.config import MaintenanceConfig
from controller.kube.api import KubeApi, Obj
from controller.kube.nodes import maintenance_mark, meta, patch_node

CONDITION = "GpuFleetHealthy"
HEALTH_LABEL = "gpufleet.io/health"
TAINT_KEY = "gpufleet.io/unhealthy"
TAINT_EFFECT = "NoSchedule"
STATES = ("healthy", "degraded", "unhealthy")  # the label's values; "unknown": a silent node
CONDITION_STATUS = {"healthy": "True", "degraded": "False", "unhealthy": "False"}  # else Unknown


@dataclass(frozen=True, slots=True)
class Health:
    state: str  # healthy, degraded, unhealthy or unknown
    reason: str  # CamelCase, as conditions want it: Healthy, Degraded, Unhealthy, AgentSilent
    message: str  # one line: the findings behind it


def _now(unix: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix))


def _taints(node: Obj) -> list[Obj]:
    return list((node.get("spec") or {}).get("taints") or [])


def node_health(node: Obj) -> str:
    """The health label gpufleet last put on the node ("" for none)."""
    return meta(node, "labels").get(HEALTH_LABEL, "")


def set_health(
    api: KubeApi,
    name: str,
    health: Health,
    *,
    taint: bool,
    now: float,
    maintenance: MaintenanceConfig | None = None,
) -> bool:
    """Bring the node's condition, label and (with `taint`) taint in line with `health`; whether
    anything was patched. A node under someone else's `maintenance` gets no taint (nor loses one)."""

    def build_meta(node: Obj) -> Obj | None:
        if health.state not in STATES:
            return None  # a silent node keeps what it had
        patch: Obj = {}
        if node_health(node) != health.state:
            patch["metadata"] = {"labels": {HEALTH_LABEL: health.state}}
        taints = _taints(node)
        has = any(t.get("key") == TAINT_KEY for t in taints)
        wants = taint and health.state == "unhealthy"
        away = maintenance is not None and bool(maintenance_mark(node, maintenance))
        if (
            has != wants and not away
        ):  # taints have no merge key: the whole list, as read, with ours in or out
            kept = [t for t in taints if t.get("key") != TAINT_KEY]
            ours = {"key": TAINT_KEY, "value": "true", "effect": TAINT_EFFECT}
            patch["spec"] = {"taints": [*kept, ours] if wants else kept}
        return patch or None

    def build_status(node: Obj) -> Obj | None:
        status = CONDITION_STATUS.get(health.state, "Unknown")
        conditions = (node.get("status") or {}).get("conditions") or []
        current = next((c for c in conditions if c.get("type") == CONDITION), None)
        if current is not None and (current.get("status"), current.get("reason"), current.get("message")) == (
            status,
            health.reason,
            health.message,
        ):
            return None
        stamp = _now(now)
        same = current is not None and current.get("status") == status
        condition = {
            "type": CONDITION,
            "status": status,
            "reason": health.reason,
            "message": health.message,
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": (current or {}).get("lastTransitionTime", stamp) if same else stamp,
        }
        return {"status": {"conditions": [condition]}}  # conditions merge by type

    _, changed_meta = patch_node(api, name, build_meta)
    _, changed_status = patch_node(api, name, build_status, status=True)
    return changed_meta or changed_status
