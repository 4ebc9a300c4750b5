"""Reading values out of Redfish JSON the same way everywhere: tolerant of missing or mistyped
properties (a BMC that omits or misspells one loses that reading, never the whole poll)."""

from __future__ import annotations

import math
import re
from typing import Any

HEALTH_RANK = {"": 0, "ok": 1, "warning": 2, "critical": 3}


def obj(value: Any, *keys: str) -> dict[str, Any]:
    """The nested object at `keys` ({} where any step is missing or not an object)."""
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, dict) else {}


def text(value: Any, *keys: str) -> str:
    """The string at `keys` ("" when missing; numbers are written out, objects are not)."""
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return ""


def number(value: Any, *keys: str) -> float | None:
    """The finite number at `keys` (None when missing, not a number, NaN or infinite)."""
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    as_float = float(value)
    return as_float if math.isfinite(as_float) else None


def link(value: Any, *keys: str) -> str:
    """The @odata.id of the link at `keys` ("" when absent)."""
    return text(obj(value, *keys), "@odata.id")


def links(value: Any, *keys: str) -> list[str]:
    """The @odata.id of every link in the array at `keys`."""
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    if not isinstance(value, list):
        return []
    return [
        item["@odata.id"]
        for item in value
        if isinstance(item, dict) and isinstance(item.get("@odata.id"), str)
    ]


def health(resource: Any, *, rollup: bool = False) -> str:
    """Status.Health (or HealthRollup, in either spelling seen in the wild) in lower case."""
    status = obj(resource, "Status")
    if rollup:
        for key in ("HealthRollup", "HealthRollUp"):
            if text(status, key):
                return text(status, key).lower()
    return text(status, "Health").lower()


def state(resource: Any) -> str:
    """Status.State in snake case ("enabled", "absent", "unavailable_offline", ...)."""
    return snake(text(obj(resource, "Status"), "State"))


def worst(healths: list[str]) -> str:
    """The worst of several health strings; unknown values count as warning."""
    return max(healths, key=lambda h: HEALTH_RANK.get(h, 2), default="")


_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def snake(name: str) -> str:
    """Redfish enum values in snake case: "SystemBoard" -> "system_board", "CPU" -> "cpu"."""
    return _CAMEL.sub("_", name).replace(" ", "_").lower()


def member_id(resource: dict[str, Any]) -> str:
    """A resource's Id, else the last segment of its @odata.id."""
    return text(resource, "Id") or text(resource, "@odata.id").split("#")[0].rstrip("/").rsplit("/", 1)[-1]
