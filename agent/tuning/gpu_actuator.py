"""What every GPU actuator shares: settings named `gpu[<index>].<name>`, and `GpuActuator`, the
Actuator over one GpuTargets field on every GPU an apply covers, through a GpuControl. GPU
actuators hold their control and ignore the host tree.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from agent.tuning.base import Change, Tree, TuningError
from agent.tuning.gpu_control import GpuControl
from agent.tuning.targets import OsTargets, Targets, as_targets

_SETTING = re.compile(r"^gpu\[(\d+)\]\.")


def setting_name(gpu: int, name: str) -> str:
    return f"gpu[{gpu}].{name}"


def gpu_of(setting: str) -> int:
    match = _SETTING.match(setting)
    if match is None:
        raise TuningError(f"{setting!r} is not a GPU setting (gpu[<index>].<name>)")
    return int(match.group(1))


class GpuActuator:
    """One GpuTargets field (`field`, also the setting's name) on every GPU in `gpus`; subclasses
    say how one GPU's value is read, resolved from the target, checked, written and read back.

    `confirm` is told whether the change is one this actuator planned (an apply) or not (a
    rollback, or a recovery in a later process), for read-backs that differ between the two.
    """

    field = ""
    pending_reboot = False

    def __init__(self, control: GpuControl, gpus: Sequence[int]) -> None:
        self.control = control
        self.gpus = list(gpus)
        self.name = f"gpu_{self.field}"  # the journal finds the actuator again by it
        self._planned: set[Change] = set()

    def current(self, gpu: int) -> str:
        raise NotImplementedError

    def wanted(self, gpu: int, target: Any) -> str:
        return str(target)

    def snapshot(self, gpu: int, current: str, wanted: str) -> str | None:
        """The value a change from `current` rolls back to; None: already at `wanted`."""
        return None if current == wanted else current

    def check(self, gpu: int, value: str) -> None:
        """Raise TuningError when `value` would be refused; writes nothing."""

    def write(self, gpu: int, value: str) -> None:
        raise NotImplementedError

    def confirm(self, gpu: int, value: str, planned: bool) -> None:
        now = self.current(gpu)
        if now != value:
            raise TuningError(f"{setting_name(gpu, self.field)}: read back {now!r} after setting {value!r}")

    # Actuator

    def read(self, tree: Tree) -> dict[str, str]:
        return {setting_name(gpu, self.field): self.current(gpu) for gpu in self.gpus}

    def plan(self, tree: Tree, targets: Targets | OsTargets) -> list[Change]:
        target = getattr(as_targets(targets).gpu, self.field)
        if target is None:
            return []
        changes = []
        for gpu in self.gpus:
            wanted = self.wanted(gpu, target)
            snapshot = self.snapshot(gpu, self.current(gpu), wanted)
            if snapshot is not None:
                changes.append(Change(setting_name(gpu, self.field), snapshot, wanted, self.pending_reboot))
        self._planned.update(changes)
        return changes

    def validate(self, tree: Tree, change: Change) -> None:
        self.check(gpu_of(change.setting), change.target)

    def apply(self, tree: Tree, change: Change) -> None:
        self.write(gpu_of(change.setting), change.target)

    def verify(self, tree: Tree, change: Change) -> None:
        self.confirm(gpu_of(change.setting), change.target, change in self._planned)
