"""PodDisruptionBudgets and the eviction subresource: a PDB's status computed from the pods it
selects (healthy: Running, Ready not False, not terminating), and the eviction check that answers
429 naming the budget, as kube-apiserver does, when evicting would go below it."""

from __future__ import annotations

import math
from typing import Any

from controller.kube.fake.errors import ApiError
from controller.kube.fake.selectors import matches
from controller.kube.fake.store import timestamp

BUDGET_MESSAGE = "Cannot evict pod as it would violate the pod's disruption budget."


def terminating(pod: dict[str, Any]) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def healthy(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    not_ready = ready is not None and ready.get("status") == "False"
    return status.get("phase") == "Running" and not terminating(pod) and not not_ready


def selects(pdb: dict[str, Any], pod: dict[str, Any]) -> bool:
    same_namespace = pdb["metadata"].get("namespace") == pod["metadata"].get("namespace")
    labels = pod["metadata"].get("labels") or {}
    return same_namespace and matches((pdb.get("spec") or {}).get("selector"), labels)


def _count(value: Any, expected: int, name: str) -> int:
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(int(value[:-1]) * expected / 100)
    if isinstance(value, int):
        return value
    raise ApiError(422, f"invalid value {value!r} for {name}: an integer or a percentage")


def pdb_status(pdb: dict[str, Any], pods: list[dict[str, Any]]) -> dict[str, Any]:
    selected = [p for p in pods if selects(pdb, p)]
    expected = len(selected)
    current = sum(healthy(p) for p in selected)
    spec = pdb.get("spec") or {}
    if spec.get("maxUnavailable") is not None:
        desired = max(0, expected - _count(spec["maxUnavailable"], expected, "maxUnavailable"))
    elif spec.get("minAvailable") is not None:
        desired = _count(spec["minAvailable"], expected, "minAvailable")
    else:
        desired = expected
    allowed = max(0, current - desired)
    reason = "SufficientPods" if allowed > 0 else "InsufficientPods"
    return {
        "observedGeneration": pdb["metadata"].get("generation", 1),
        "disruptionsAllowed": allowed,
        "currentHealthy": current,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "conditions": [
            {
                "type": "DisruptionAllowed",
                "status": "True" if allowed > 0 else "False",
                "reason": reason,
                "message": "",
                "observedGeneration": pdb["metadata"].get("generation", 1),
                "lastTransitionTime": pdb["metadata"].get("creationTimestamp") or timestamp(),
            }
        ],
    }


def with_status(pdb: dict[str, Any], pods: list[dict[str, Any]]) -> dict[str, Any]:
    return {**pdb, "status": pdb_status(pdb, pods)}


def mark_disruption_target(pod: dict[str, Any]) -> None:
    """The condition the eviction API sets on a pod it is about to delete."""
    conditions = pod.setdefault("status", {}).setdefault("conditions", [])
    for c in conditions:
        if c.get("type") == "DisruptionTarget":
            conditions.remove(c)
            break
    conditions.append(
        {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "EvictionByEvictionAPI",
            "message": "Eviction API: evicting",
            "lastTransitionTime": timestamp(),
        }
    )


def check(pod: dict[str, Any], pdbs: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
    """Raise the API error an eviction of `pod` meets, or return when the pod may go."""
    phase = (pod.get("status") or {}).get("phase")
    if phase in ("Succeeded", "Failed", "Pending") or terminating(pod):
        return  # no budget protects these
    budgets = [p for p in pdbs if selects(p, pod)]
    if not budgets:
        return
    if len(budgets) > 1:
        raise ApiError(
            500,
            "This pod has more than one PodDisruptionBudget, "
            "which the eviction subresource does not support.",
        )
    pdb = budgets[0]
    status = pdb_status(pdb, pods)
    if not healthy(pod):
        policy = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy", "IfHealthyBudget")
        if policy == "AlwaysAllow" or status["currentHealthy"] >= status["desiredHealthy"] > 0:
            return
    if status["disruptionsAllowed"] > 0:
        return
    name = pdb["metadata"]["name"]
    cause = (
        f"The disruption budget {name} needs {status['desiredHealthy']} healthy pods "
        f"and has {status['currentHealthy']} currently"
    )
    raise ApiError(
        429, BUDGET_MESSAGE, details={"causes": [{"reason": "DisruptionBudget", "message": cause}]}
    )
