"""The simulated BMC's BIOS settings: the fleet's attributes (sim/bmc_chassis.py) with the drifted
ones of the BMC's condition (the bios_drift fault) over them, pending writes that a reboot of the
simulated node applies, and the attribute registry a real BMC would publish for them.

`SimBiosControl` is both the simulated BIOS and the BiosControl the tuning actuator writes through.
A reboot keeps `BmcCondition.bios_attributes` meaning what it always did, the attributes that
differ from the fleet: one set back to the fleet's value leaves it, so a bios_drift finding clears.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

from agent.tuning.base import TuningError
from agent.tuning.bios import ENUMERATION, BiosAttribute, BiosState

if TYPE_CHECKING:
    from agent.sources.sim.bmc import SimBmc

_ON_OFF = ("Enabled", "Disabled")
# Each attribute's allowable values: the fleet's and the drifted one among them.
_ALLOWABLE: dict[str, tuple[str, ...]] = {
    "BootMode": ("UEFI", "Legacy"),
    "SecureBoot": _ON_OFF,
    "Hyperthreading": _ON_OFF,
    "TurboMode": _ON_OFF,
    "EnergyPerformanceBias": ("Performance", "Balanced Performance", "Balanced Power", "Power"),
    "PackageCState": ("C0/C1", "C2", "C6", "No Limit"),
    "C1EState": _ON_OFF,
    "SubNumaClustering": ("Disabled", "SNC2", "SNC4"),
    "VTdSupport": _ON_OFF,
    "SriovSupport": _ON_OFF,
    "AboveFourGDecoding": _ON_OFF,
    "ResizableBar": _ON_OFF,
    "MmiohBase": ("1T", "2T", "4T", "8T", "16T", "32T"),
    "MmiohSize": ("64G", "128G", "256G", "512G", "1024G"),
    "PcieAcsControl": _ON_OFF,
    "PcieMaxPayloadSize": ("Auto", "128B", "256B", "512B"),
    "TpmSupport": _ON_OFF,
    "PowerRestorePolicy": ("AlwaysOn", "AlwaysOff", "LastState"),
}
# Owned by the platform's TPM provisioning, not writable through Redfish.
_READ_ONLY = frozenset({"TpmSupport"})


def sim_registry(attributes: Mapping[str, str]) -> dict[str, BiosAttribute]:
    """The registry entries for `attributes` (an attribute without a known list takes any text)."""
    return {
        name: BiosAttribute(
            name,
            ENUMERATION if name in _ALLOWABLE else "String",
            read_only=name in _READ_ONLY,
            allowable=_ALLOWABLE.get(name, (value,)),
        )
        for name, value in attributes.items()
    }


class SimBiosControl:
    """The BIOS of one SimBmc. Writes are pending until `reboot()`; reads are thread-safe (the
    BMC poll reads from its own thread)."""

    def __init__(self, bmc: SimBmc) -> None:
        self.bmc = bmc
        self.settings: dict[str, str] = {}  # written, not yet applied (may equal the current value)
        self.writes: list[dict[str, str]] = []  # every set_pending, for tests
        self._registry = sim_registry(bmc.chassis.bios_attributes)
        self._lock = threading.Lock()

    def current(self) -> dict[str, str]:
        return {**self.bmc.chassis.bios_attributes, **self.bmc.condition.bios_attributes}

    def read(self) -> BiosState:
        with self._lock:
            current = self.current()
            pending = {k: v for k, v in self.settings.items() if current.get(k) != v}
        return BiosState(current, pending)

    def registry(self) -> dict[str, BiosAttribute] | None:
        return dict(self._registry)

    def vendor(self) -> str:
        return ""

    def set_pending(self, attributes: Mapping[str, str]) -> None:
        unknown = sorted(set(attributes) - set(self._registry))
        if unknown:
            raise TuningError(f"BMC {self.bmc.endpoint}: unknown BIOS attributes {', '.join(unknown)}")
        for name, value in attributes.items():
            spec = self._registry[name]
            if spec.read_only or value not in spec.allowable:
                raise TuningError(f"BMC {self.bmc.endpoint}: BIOS attribute {name} refused {value!r}")
        with self._lock:
            self.settings.update(attributes)
            self.writes.append(dict(attributes))

    def reboot(self) -> None:
        """The node restarts: the pending settings become current."""
        with self._lock:
            fleet, drifted = self.bmc.chassis.bios_attributes, self.bmc.condition.bios_attributes
            for name, value in self.settings.items():
                if value == fleet.get(name):
                    drifted.pop(name, None)
                else:
                    drifted[name] = value
            self.settings.clear()
