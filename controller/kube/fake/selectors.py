"""Selectors: `fieldSelector` and `labelSelector` query strings as clients send them, and the
LabelSelector objects (matchLabels, matchExpressions) of a PodDisruptionBudget."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from controller.kube.fake.errors import ApiError

Predicate = Callable[[dict[str, Any]], bool]

_REQUIREMENT = re.compile(
    r"^\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9._/-]+)\s*"
    r"(?:(?P<op>==|=|!=|\s+in\s+|\s+notin\s+)\s*(?P<value>\([^)]*\)|[A-Za-z0-9._-]*))?\s*$"
)


def _split_top(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


def _field(obj: dict[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def field_selector(text: str, allowed: Sequence[str]) -> Predicate:
    terms: list[tuple[str, bool, str]] = []
    for part in _split_top(text):
        m = re.match(r"^\s*([^=!]+?)\s*(==|=|!=)\s*(.*?)\s*$", part)
        if not m:
            raise ApiError(400, f"invalid selector: '{text}'; can't understand '{part}'")
        key, op, value = m.groups()
        if key not in allowed:
            raise ApiError(400, f"field label not supported: {key}")
        terms.append((key, op != "!=", value))
    return lambda obj: all((_field(obj, k) == v) == eq for k, eq, v in terms)


def label_selector(text: str) -> Predicate:
    terms: list[Predicate] = []
    for part in _split_top(text):
        m = _REQUIREMENT.match(part)
        if not m or (m["neg"] and m["op"]):
            raise ApiError(400, f"unable to parse requirement: {part!r}")
        key, op, value = m["key"], (m["op"] or "").strip(), m["value"] or ""
        if not op:
            operator = "DoesNotExist" if m["neg"] else "Exists"
            terms.append(_expression(key, operator, []))
        elif op in ("in", "notin"):
            if not value.startswith("("):
                raise ApiError(400, f"unable to parse requirement: {part!r}: expected a set in parentheses")
            values = [v.strip() for v in value[1:-1].split(",") if v.strip()]
            terms.append(_expression(key, "In" if op == "in" else "NotIn", values))
        else:
            terms.append(_expression(key, "NotIn" if op == "!=" else "In", [value]))
    return lambda obj: all(t(_labels(obj)) for t in terms)


def _labels(obj: dict[str, Any]) -> dict[str, Any]:
    labels = obj.get("metadata", {}).get("labels") or {}
    return labels if isinstance(labels, dict) else {}


def _expression(key: str, operator: str, values: list[str]) -> Predicate:
    if operator == "In":
        return lambda labels: key in labels and labels[key] in values
    if operator == "NotIn":
        return lambda labels: key not in labels or labels[key] not in values
    if operator == "Exists":
        return lambda labels: key in labels
    if operator == "DoesNotExist":
        return lambda labels: key not in labels
    raise ApiError(422, f'"{operator}": not a valid selector operator')


def matches(selector: dict[str, Any] | None, labels: dict[str, Any]) -> bool:
    """A LabelSelector object: null matches nothing, {} matches everything (policy/v1 semantics)."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        test = _expression(expr.get("key", ""), expr.get("operator", ""), list(expr.get("values") or []))
        if not test(labels):
            return False
    return True
