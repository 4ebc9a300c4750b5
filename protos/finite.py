"""Numbers in a configuration must be finite, for the agent and the controller alike. YAML reads
.nan and .inf (and a flag, `--interval nan`) as floats that pass every range check written
`x <= 0` or `x < low`, and then make a wait that never ends or a deadline that passes at once: a
controller with `detect: {interval_seconds: .nan}` did not stop on SIGTERM. Checked once, on the
loaded document, before it is converted."""

from __future__ import annotations

import math
from typing import Any


def non_finite(value: Any, where: str = "") -> tuple[str, float] | None:
    """(the dotted path, the value) of the first NaN or infinity in `value`, through nested
    mappings and lists; None when every number is finite."""
    if isinstance(value, float) and not math.isfinite(value):
        return where, value
    items: Any = ()
    if isinstance(value, dict):
        items = ((f"{where}.{key}" if where else str(key), item) for key, item in value.items())
    elif isinstance(value, list):
        items = ((f"{where}[{i}]", item) for i, item in enumerate(value))
    for path, item in items:
        found = non_finite(item, path)
        if found is not None:
            return found
    return None


def finite_message(found: tuple[str, float]) -> str:
    where, value = found
    return f"{where} must be a finite number, not {value}"
