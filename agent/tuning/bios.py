"""BIOS attributes through the BMC: the BiosControl contract (what sits behind it: Redfish on a real
node, agent/sources/redfish/bios_control.py, or the simulated BMC, agent/sources/sim/bios.py) and
the actuator that plans, validates, writes and reads back `bmc.bios.<Attribute>` settings.

Every write goes to the pending settings and takes effect at the next reboot, so every Change is
pending_reboot and reads back as the value the next boot will use: the pending one where one is
set, else the current one (a service that applies at once). Rollback writes the snapshot value as
pending again, which clears the change. After the reboot, `bios_reboot_state` says which changes
are now current, which are still pending and which the BIOS dropped.

Values travel as text ("Enabled", "4", "true"); the control turns them back into the registry's
JSON type when it writes. Every control method raises TuningError with one line, never a foreign
exception.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from agent.tuning.base import Change, Tree, TuningError
from agent.tuning.targets import Targets

PREFIX = "bmc.bios."
ENUMERATION, STRING, INTEGER, BOOLEAN = "Enumeration", "String", "Integer", "Boolean"


@dataclass(frozen=True, slots=True)
class BiosAttribute:
    """One attribute registry entry, as much of it as validation needs."""

    name: str
    type: str = STRING  # Enumeration, String, Integer, Boolean, Password
    read_only: bool = False  # ReadOnly or Immutable in the registry
    allowable: tuple[str, ...] = ()  # an Enumeration's ValueNames
    lower: int | None = None  # an Integer's LowerBound / UpperBound
    upper: int | None = None


@dataclass(frozen=True, slots=True)
class BiosState:
    """The attributes in effect now and those pending (only the ones that differ from current)."""

    current: dict[str, str] = field(default_factory=dict)
    pending: dict[str, str] = field(default_factory=dict)

    @property
    def next_boot(self) -> dict[str, str]:
        """What the next boot will use: current, with the pending values over it."""
        return {**self.current, **self.pending}


class BiosControl(Protocol):
    def read(self) -> BiosState:
        """The current and pending attributes, as text."""
        ...

    def registry(self) -> dict[str, BiosAttribute] | None:
        """The attribute registry by attribute name; None when the service publishes none."""
        ...

    def vendor(self) -> str:
        """The platform vendor as profiles name it ("dell", "hpe"), "" when unknown."""
        ...

    def set_pending(self, attributes: Mapping[str, str]) -> None:
        """Write `attributes` to the pending settings (applied at the next reboot)."""
        ...


def bios_text(value: str | int | float | bool | None) -> str:
    """A BIOS value as text, the way the Redfish sources write it: booleans JSON-style."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def check_value(spec: BiosAttribute, value: str) -> None:
    """TuningError naming the attribute, the value and what it takes, unless `value` would do."""
    name = spec.name
    if spec.read_only:
        raise TuningError(f"BIOS attribute {name} is read-only on this BMC: cannot set it to {value!r}")
    if spec.type == ENUMERATION and spec.allowable and value not in spec.allowable:
        allowed = ", ".join(spec.allowable)
        raise TuningError(f"BIOS attribute {name} does not take {value!r} (allowed: {allowed})")
    if spec.type == BOOLEAN and value not in ("true", "false"):
        raise TuningError(f"BIOS attribute {name} does not take {value!r} (allowed: true, false)")
    if spec.type == INTEGER:
        try:
            number = int(value)
        except ValueError:
            raise TuningError(f"BIOS attribute {name} does not take {value!r} (an integer)") from None
        low = -(2**63) if spec.lower is None else spec.lower
        high = 2**63 if spec.upper is None else spec.upper
        if not low <= number <= high:
            bounds = f"{'' if spec.lower is None else spec.lower}..{'' if spec.upper is None else spec.upper}"
            raise TuningError(f"BIOS attribute {name} does not take {value!r} (allowed: {bounds})")


def _attribute(setting: str) -> str:
    if not setting.startswith(PREFIX):
        raise TuningError(f"{setting} is no BIOS setting (they are named {PREFIX}<Attribute>)")
    return setting[len(PREFIX) :]


class BiosActuator:
    """`bmc.bios.<Attribute>` through a BiosControl; ignores the host tree. A profile's generic
    name is used where the BMC knows it, else its alternative for the control's vendor."""

    name = "bios"

    def __init__(self, control: BiosControl) -> None:
        self.control = control

    def read(self, tree: Tree) -> dict[str, str]:
        return {PREFIX + name: value for name, value in self.control.read().next_boot.items()}

    def plan(self, tree: Tree, targets: Targets) -> list[Change]:
        wanted = targets.bmc
        if not wanted.bios:
            return []  # nothing asked: the BMC is not even read
        next_boot = self.control.read().next_boot
        registry = self.control.registry()
        known = set(next_boot) if registry is None else set(registry)
        vendor = self.control.vendor()
        changes = []
        for generic, value in wanted.bios.items():
            name, target = generic, value
            alternative = wanted.vendors.get(generic, {}).get(vendor)
            if generic not in known and alternative is not None:
                name, target = alternative
            text = bios_text(target)
            have = next_boot.get(name)
            if have != text:
                changes.append(Change(PREFIX + name, "" if have is None else have, text, pending_reboot=True))
        return changes

    def validate(self, tree: Tree, change: Change) -> None:
        name = _attribute(change.setting)
        registry = self.control.registry()
        if registry is None:
            # No registry to check against: only that the BMC has the attribute at all.
            if name not in self.control.read().current:
                raise TuningError(
                    f"BIOS attribute {name} is not on this BMC: cannot set it to {change.target!r}"
                )
            return
        spec = registry.get(name)
        if spec is None:
            raise TuningError(
                f"BIOS attribute {name} is not in this BMC's attribute registry: "
                f"cannot set it to {change.target!r}"
            )
        check_value(spec, change.target)

    def apply(self, tree: Tree, change: Change) -> None:
        self.control.set_pending({_attribute(change.setting): change.target})

    def verify(self, tree: Tree, change: Change) -> None:
        name = _attribute(change.setting)
        state = self.control.read()
        got = state.next_boot.get(name)
        if got != change.target:
            where = "pending" if name in state.pending else "current, nothing pending"
            raise TuningError(f"BIOS attribute {name} reads back {got!r} ({where}), not {change.target!r}")


@dataclass(frozen=True, slots=True)
class BiosRebootState:
    """Where the BIOS changes of an apply stand, read after a reboot (setting names)."""

    verified: list[str] = field(default_factory=list)  # now current at the target
    pending: list[str] = field(default_factory=list)  # still waiting for a reboot
    lost: list[str] = field(default_factory=list)  # neither: the BIOS dropped or refused the change

    @property
    def done(self) -> bool:
        return not self.pending and not self.lost


def bios_reboot_state(control: BiosControl, changes: Sequence[Change]) -> BiosRebootState:
    """Sort an apply's BIOS changes (others are ignored) by what the BMC reads now."""
    state = control.read()
    result = BiosRebootState()
    for change in changes:
        if not change.setting.startswith(PREFIX):
            continue
        name = change.setting[len(PREFIX) :]
        if state.current.get(name) == change.target:
            result.verified.append(change.setting)
        elif state.pending.get(name) == change.target:
            result.pending.append(change.setting)
        else:
            result.lost.append(change.setting)
    return result
