"""The OS-level targets the agent is asked to reach: plain data, named as the controller's profile
schema names them (os.cpu_governor, os.sysctls, os.transparent_hugepages.{enabled,defrag},
os.hugepages). The agent never imports the controller; `from_dict` reads the profile's `os`
mapping (bare values, or the schema's {target, reason, source} settings)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The sysctls a profile may set, with their allowed range (inclusive): the same allowlist as the
# controller's profile schema (tests/agent/tuning checks they agree). Anything else is refused.
SYSCTLS: dict[str, tuple[int, int]] = {
    "kernel.numa_balancing": (0, 1),
    "kernel.sched_autogroup_enabled": (0, 1),
    "vm.swappiness": (0, 200),
    "vm.zone_reclaim_mode": (0, 7),
    "vm.dirty_ratio": (0, 100),
    "vm.dirty_background_ratio": (0, 100),
    "vm.min_free_kbytes": (0, 2**31 - 1),
}


@dataclass(frozen=True, slots=True)
class OsTargets:
    cpu_governor: str | None = None
    sysctls: dict[str, int] = field(default_factory=dict)
    thp_enabled: str | None = None
    thp_defrag: str | None = None
    hugepages: int | None = None

    @classmethod
    def from_dict(cls, os_section: Mapping[str, Any]) -> OsTargets:
        thp = os_section.get("transparent_hugepages") or {}
        return cls(
            cpu_governor=_target(os_section.get("cpu_governor")),
            sysctls={name: int(_target(v)) for name, v in (os_section.get("sysctls") or {}).items()},
            thp_enabled=_target(thp.get("enabled")),
            thp_defrag=_target(thp.get("defrag")),
            hugepages=_target(os_section.get("hugepages")),
        )


def _target(value: Any) -> Any:
    """A bare value, or the `target` of a profile setting ({target, reason, source})."""
    return value.get("target") if isinstance(value, Mapping) else value
