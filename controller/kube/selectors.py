"""Label selectors, as the API server matches them: which PodDisruptionBudget covers a pod (to
name the budget behind an eviction's 429 when the answer does not)."""

from __future__ import annotations

from typing import Any

from controller.kube.api import Obj


def matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels and matchExpressions) against a pod's labels. An empty
    selector matches every pod (policy/v1 PDB semantics); a missing one matches none."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key", ""), expr.get("operator", ""), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def budget_of(pod: Obj, budgets: list[Obj]) -> str:
    """The name of the first budget whose selector matches the pod ("" for none)."""
    labels = dict((pod.get("metadata") or {}).get("labels") or {})
    for pdb in sorted(budgets, key=lambda b: str((b.get("metadata") or {}).get("name", ""))):
        if matches((pdb.get("spec") or {}).get("selector"), labels):
            return str((pdb.get("metadata") or {}).get("name", ""))
    return ""
