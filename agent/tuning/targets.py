"""The targets the agent is asked to reach, at three levels (gpu, os, bmc): plain data, named as
the controller's profile schema names them (gpu.power_limit, os.cpu_governor, os.sysctls,
os.transparent_hugepages.{enabled,defrag}, os.hugepages, bmc.bios.<Attribute>). The agent never
imports the controller; `Targets.from_dict` reads a profile's mappings (bare values, or the
schema's {target, reason, source} settings), as ApplyProfile.targets_json carries them."""

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
    return value["target"] if isinstance(value, Mapping) and "target" in value else value


# Clock bounds the agent resolves per GPU: its base clock, or the highest supported one.
CLOCK_KEYWORDS = ("base", "max")
ClockBound = int | str  # MHz, or one of CLOCK_KEYWORDS
ClockTarget = tuple[ClockBound, ClockBound] | str  # (min, max), or "reset"


@dataclass(frozen=True, slots=True)
class GpuTargets:
    """NVML settings, for every GPU the apply covers. None: leave as is."""

    persistence_mode: str | None = None  # "on" | "off"
    power_limit: int | str | None = None  # watts, or "default"
    locked_gpu_clocks: ClockTarget | None = None
    locked_memory_clocks: ClockTarget | None = None
    compute_mode: str | None = None  # "default" | "exclusive_process" | "prohibited"
    ecc: str | None = None  # "on" | "off": pending until the next reboot

    @classmethod
    def from_dict(cls, gpu_section: Mapping[str, Any]) -> GpuTargets:
        return cls(
            persistence_mode=_on_off(_target(gpu_section.get("persistence_mode"))),
            power_limit=_target(gpu_section.get("power_limit")),
            locked_gpu_clocks=_clocks(_target(gpu_section.get("locked_gpu_clocks"))),
            locked_memory_clocks=_clocks(_target(gpu_section.get("locked_memory_clocks"))),
            compute_mode=_target(gpu_section.get("compute_mode")),
            ecc=_on_off(_target(gpu_section.get("ecc"))),
        )

    def empty(self) -> bool:
        return all(getattr(self, name) is None for name in self.__slots__)


@dataclass(frozen=True, slots=True)
class BmcTargets:
    """BIOS attributes (registry name -> value, with the vendor alternatives of the profile);
    firmware is never applied, so it is not a target."""

    bios: dict[str, str | int | bool] = field(default_factory=dict)
    vendors: dict[str, dict[str, tuple[str, str | int | bool]]] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, bmc_section: Mapping[str, Any]) -> BmcTargets:
        bios: dict[str, str | int | bool] = {}
        vendors: dict[str, dict[str, tuple[str, str | int | bool]]] = {}
        for name, value in (bmc_section.get("bios") or {}).items():
            bios[name] = _target(value)
            if isinstance(value, Mapping):
                for vendor, alt in (value.get("vendors") or {}).items():
                    vendors.setdefault(name, {})[vendor] = (alt["name"], alt["target"])
        return cls(bios=bios, vendors=vendors)


@dataclass(frozen=True, slots=True)
class Targets:
    """What one apply asks for, at every level."""

    os: OsTargets = field(default_factory=OsTargets)
    gpu: GpuTargets = field(default_factory=GpuTargets)
    bmc: BmcTargets = field(default_factory=BmcTargets)

    @classmethod
    def from_dict(cls, profile: Mapping[str, Any]) -> Targets:
        """A profile's {gpu, os, bmc} mappings; a level left out asks for nothing there."""
        unknown = sorted(set(profile) - {"gpu", "os", "bmc"})
        if unknown:
            raise ValueError(f"unknown level(s) {', '.join(unknown)}: a profile has gpu, os and bmc")
        return cls(
            os=OsTargets.from_dict(profile.get("os") or {}),
            gpu=GpuTargets.from_dict(profile.get("gpu") or {}),
            bmc=BmcTargets.from_dict(profile.get("bmc") or {}),
        )


def as_targets(targets: Targets | OsTargets) -> Targets:
    return targets if isinstance(targets, Targets) else Targets(os=targets)


def _on_off(value: Any) -> str | None:
    """YAML 1.1 reads a bare on/off as a boolean: both spellings mean the same."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return None if value is None else str(value)


def _clocks(value: Any) -> ClockTarget | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return (value["min_mhz"], value["max_mhz"])
    low, high = value
    return (low, high)
