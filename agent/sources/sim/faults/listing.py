"""`gpufleet agent --sim --list-faults`: the fault registry as a table or as JSON ({"faults": [...]})."""

from __future__ import annotations

import json

from agent.sources.sim.faults import FAULTS


def fault_list(output: str = "table") -> str:
    """Every registered fault, by level: its --fault syntax, level, cause and description."""
    if output == "json":
        return json.dumps({"faults": [f.as_dict() for f in FAULTS.values()]}, indent=2)
    if output != "table":
        raise ValueError(f"unknown output {output!r}; expected table or json")
    rows = [("FAULT", "LEVEL", "CAUSE", "DESCRIPTION")]
    rows += [(f.syntax, f.level, f.cause, f.description) for f in FAULTS.values()]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join(
        "  ".join([*(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True)), row[3]])
        for row in rows
    )
