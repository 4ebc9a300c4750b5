"""The schema of a tuning profile: target settings at three levels (gpu, os, bmc), each with its
one-line reason, its source and its risk.

A profile is data (YAML, see controller/profiles/catalogue/); these Structs validate it. Checks that
need a setting's own value raise ValueError here; `controller.profiles.catalogue` turns every
error into one line naming the file, the key path and the allowed values.

Application clocks are not a setting: they are deprecated in NVML 13 and removed in CUDA 14.
Locked clocks (`locked_gpu_clocks`, `locked_memory_clocks`) replace them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

Risk = Literal["online", "needs_reboot"]
RISKS: tuple[Risk, ...] = ("online", "needs_reboot")
LEVELS = ("gpu", "os", "bmc")

ON_OFF = ("on", "off")
COMPUTE_MODES = ("default", "exclusive_process", "prohibited")
CPU_GOVERNORS = ("performance", "powersave", "schedutil", "ondemand", "conservative", "userspace")
THP_ENABLED = ("always", "madvise", "never")  # /sys/kernel/mm/transparent_hugepage/enabled
THP_DEFRAG = ("always", "defer", "defer+madvise", "madvise", "never")  # .../defrag
# A clock bound the agent resolves per GPU model: its base clock, or the highest supported one.
CLOCK_KEYWORDS = ("base", "max")
# The sysctls a profile may set, each with its allowed range (inclusive).
SYSCTLS: dict[str, tuple[int, int]] = {
    "kernel.numa_balancing": (0, 1),
    "kernel.sched_autogroup_enabled": (0, 1),
    "vm.swappiness": (0, 200),
    "vm.zone_reclaim_mode": (0, 7),
    "vm.dirty_ratio": (0, 100),
    "vm.dirty_background_ratio": (0, 100),
    "vm.min_free_kbytes": (0, 2**31 - 1),
}
# Keys that once meant application clocks: named in the error, so nobody reaches for them.
APPLICATION_CLOCK_KEYS = ("application_clocks", "applications_clocks", "app_clocks")
APPLICATION_CLOCKS_GONE = (
    "application clocks are deprecated in NVML 13 and removed in CUDA 14; "
    "use locked_gpu_clocks / locked_memory_clocks"
)
NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
VENDOR = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


def one_of(value: object, allowed: tuple[str, ...]) -> str:
    return f"{value!r} is not one of {', '.join(allowed)}"


class _Strict(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class _Setting(_Strict):
    """What every setting carries besides its target: why, and where that advice comes from."""

    reason: str
    source: str

    def __post_init__(self) -> None:
        if not self.reason.strip() or "\n" in self.reason.strip():
            raise ValueError("reason must be one non-empty line")
        if not self.source.strip():
            raise ValueError("source must name a URL or a document")


def _on_off(target: bool | str) -> str:
    """YAML 1.1 reads a bare on/off as a boolean: both spellings mean the same."""
    if isinstance(target, bool):
        return "on" if target else "off"
    if target not in ON_OFF:
        raise ValueError(one_of(target, ON_OFF))
    return target


class OnOff(_Setting):
    target: bool | str

    def __post_init__(self) -> None:
        super().__post_init__()
        self.target = _on_off(self.target)


class PowerLimit(_Setting):
    """Watts, or `default` (the board's default limit); the agent checks it against the GPU's
    min/max constraints and reads back the enforced limit."""

    target: int | str

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.target, str):
            if self.target != "default":
                raise ValueError(f"{self.target!r} is not watts (a positive integer) or 'default'")
        elif self.target <= 0:
            raise ValueError(f"power limit must be positive watts or 'default', not {self.target}")


class ClockRange(_Strict):
    min_mhz: int | str
    max_mhz: int | str


def _check_bound(value: int | str, what: str) -> None:
    if isinstance(value, str):
        if value not in CLOCK_KEYWORDS:
            raise ValueError(f"{what}: {one_of(value, CLOCK_KEYWORDS)} (or MHz)")
    elif value <= 0:
        raise ValueError(f"{what} must be positive MHz, not {value}")


class LockedClocks(_Setting):
    """min/max MHz (or `base` / `max`, resolved per GPU model by the agent), or `reset`."""

    target: ClockRange | str

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.target, str):
            if self.target != "reset":
                raise ValueError(f"{self.target!r} is not {{min_mhz, max_mhz}} or 'reset'")
            return
        low, high = self.target.min_mhz, self.target.max_mhz
        _check_bound(low, "min_mhz")
        _check_bound(high, "max_mhz")
        if isinstance(low, int) and isinstance(high, int) and low > high:
            raise ValueError(f"min_mhz {low} is above max_mhz {high}")
        if low == "max" and high == "base":
            raise ValueError("min_mhz 'max' is above max_mhz 'base'")


class ComputeMode(_Setting):
    target: str

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.target not in COMPUTE_MODES:
            raise ValueError(one_of(self.target, COMPUTE_MODES))


class GpuSettings(_Strict):
    persistence_mode: OnOff | None = None
    power_limit: PowerLimit | None = None
    locked_gpu_clocks: LockedClocks | None = None
    locked_memory_clocks: LockedClocks | None = None
    compute_mode: ComputeMode | None = None
    ecc: OnOff | None = None  # takes effect at the next reboot: pending until then


class Governor(_Setting):
    target: str

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.target not in CPU_GOVERNORS:
            raise ValueError(one_of(self.target, CPU_GOVERNORS))


class Sysctl(_Setting):
    target: int


class ThpValue(_Setting):
    target: str


class TransparentHugepages(_Strict):
    enabled: ThpValue | None = None
    defrag: ThpValue | None = None

    def __post_init__(self) -> None:
        if self.enabled is not None and self.enabled.target not in THP_ENABLED:
            raise ValueError(f"@enabled.target: {one_of(self.enabled.target, THP_ENABLED)}")
        if self.defrag is not None and self.defrag.target not in THP_DEFRAG:
            raise ValueError(f"@defrag.target: {one_of(self.defrag.target, THP_DEFRAG)}")


class Hugepages(_Setting):
    """The number of default-size huge pages (vm.nr_hugepages)."""

    target: int

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.target < 0:
            raise ValueError(f"hugepages must be 0 or more, not {self.target}")


class OsSettings(_Strict):
    cpu_governor: Governor | None = None
    sysctls: dict[str, Sysctl] = msgspec.field(default_factory=dict)
    transparent_hugepages: TransparentHugepages | None = None
    hugepages: Hugepages | None = None


class VendorAttribute(_Strict):
    """The same intent under a vendor's own attribute name and value."""

    name: str
    target: str | int | bool


class BiosAttribute(_Setting):
    """A BIOS attribute (the name the BMC's attribute registry uses), with vendor alternatives;
    pending until the next reboot."""

    target: str | int | bool
    vendors: dict[str, VendorAttribute] = msgspec.field(default_factory=dict)


class FirmwareBaseline(_Setting):
    """Recommend only: `fleet` (the fleet majority's version) or a pinned version."""

    component: str
    target: str


class BmcSettings(_Strict):
    bios: dict[str, BiosAttribute] = msgspec.field(default_factory=dict)
    firmware: list[FirmwareBaseline] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for i, entry in enumerate(self.firmware):
            if entry.component in seen:
                raise ValueError(f"@firmware[{i}].component: {entry.component!r} is listed twice")
            seen.add(entry.component)


class Profile(_Strict):
    name: str
    description: str
    gpu: GpuSettings | None = None
    os: OsSettings | None = None
    bmc: BmcSettings | None = None

    def __post_init__(self) -> None:
        if not NAME.match(self.name):
            raise ValueError(f"@name: {self.name!r} must be lower-case letters, digits and '-'")
        if not self.settings():
            raise ValueError("a profile sets at least one setting (gpu, os or bmc)")

    def levels(self) -> list[str]:
        return sorted({s.level for s in self.settings()}, key=LEVELS.index)

    def settings(self) -> list[SettingView]:
        """Every setting, flattened, in document order."""
        out: list[SettingView] = []
        if self.gpu is not None:
            for field in msgspec.structs.fields(GpuSettings):
                value = getattr(self.gpu, field.name)
                if value is not None:
                    risk: Risk = "needs_reboot" if field.name == "ecc" else "online"
                    out.append(SettingView.of(f"gpu.{field.name}", value, risk))
        if self.os is not None:
            if self.os.cpu_governor is not None:
                out.append(SettingView.of("os.cpu_governor", self.os.cpu_governor, "online"))
            for key, sysctl in self.os.sysctls.items():
                out.append(SettingView.of(f"os.sysctls.{key}", sysctl, "online"))
            thp = self.os.transparent_hugepages
            for name, thp_value in (("enabled", thp and thp.enabled), ("defrag", thp and thp.defrag)):
                if thp_value:
                    out.append(SettingView.of(f"os.transparent_hugepages.{name}", thp_value, "online"))
            if self.os.hugepages is not None:
                out.append(SettingView.of("os.hugepages", self.os.hugepages, "online"))
        if self.bmc is not None:
            for key, attribute in self.bmc.bios.items():
                view = SettingView.of(f"bmc.bios.{key}", attribute, "needs_reboot")
                view.vendors = {v: {"name": a.name, "target": a.target} for v, a in attribute.vendors.items()}
                out.append(view)
            for firmware in self.bmc.firmware:
                view = SettingView.of(f"bmc.firmware.{firmware.component}", firmware, "needs_reboot")
                view.recommend_only = True
                out.append(view)
        return out

    def risk(self) -> Risk:
        return "needs_reboot" if any(s.risk == "needs_reboot" for s in self.settings()) else "online"


@dataclass
class SettingView:
    """One setting as the CLI and the cause map see it."""

    path: str  # gpu.power_limit, os.sysctls.vm.swappiness, bmc.bios.PcieAcsControl, ...
    target: Any  # plain data: a string, a number, a boolean or {min_mhz, max_mhz}
    risk: Risk
    reason: str
    source: str
    recommend_only: bool = False  # firmware: proposed to an operator, never applied
    vendors: dict[str, dict[str, Any]] | None = None

    @property
    def level(self) -> str:
        return self.path.split(".", 1)[0]

    @classmethod
    def of(cls, path: str, setting: Any, risk: Risk) -> SettingView:
        return cls(path, msgspec.to_builtins(setting.target), risk, setting.reason, setting.source)

    def target_text(self) -> str:
        target = self.target
        if isinstance(target, dict):
            return f"{target['min_mhz']}..{target['max_mhz']} MHz"
        if isinstance(target, bool):
            return "true" if target else "false"
        return str(target)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "setting": self.path,
            "level": self.level,
            "target": self.target,
            "risk": self.risk,
            "action": "recommend" if self.recommend_only else "apply",
            "reason": self.reason,
            "source": self.source,
        }
        if self.vendors:
            out["vendors"] = self.vendors
        return out
