"""The GPU actuators: each GpuTargets setting on every GPU an apply covers, through a GpuControl
(NVML on a node, the simulator with --sim), in `gpu_actuators`.

Values are text as the journal keeps them: persistence and ECC "on"/"off", the power limit in
watts ("700"; `default` is resolved when planning), the compute mode's name, locked clocks as
gpu_clocks.py says. ECC changes are pending until the next reboot: they read back (and roll back)
as the pending mode. The power limit must be enforced as set: a lower cap from elsewhere (the BMC,
a system power budget) is refused before any write where it shows, and fails the read-back where
it does not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agent.tuning.base import Actuator, TuningError
from agent.tuning.gpu_actuator import GpuActuator, setting_name
from agent.tuning.gpu_clocks import LockedGpuClocks, LockedMemoryClocks
from agent.tuning.gpu_control import GpuControl

ON_OFF = ("on", "off")
COMPUTE_MODES = ("default", "exclusive_process", "prohibited")


def watts_text(watts: float) -> str:
    """700.0 -> "700"; a limit set in odd milliwatts keeps them, so that a rollback is exact."""
    return str(int(watts)) if float(watts).is_integer() else f"{watts:.3f}".rstrip("0")


def _mw(watts: float) -> int:
    return round(watts * 1000)


class OnOff(GpuActuator):
    def check(self, gpu: int, value: str) -> None:
        if value not in ON_OFF:
            raise TuningError(f"{setting_name(gpu, self.field)}: {value!r} is not on or off")


class Persistence(OnOff):
    field = "persistence_mode"

    def current(self, gpu: int) -> str:
        return "on" if self.control.persistence(gpu) else "off"

    def write(self, gpu: int, value: str) -> None:
        self.control.set_persistence(gpu, value == "on")


class Ecc(OnOff):
    """The pending mode: what the GPU runs with after the next reboot."""

    field = "ecc"
    pending_reboot = True

    def current(self, gpu: int) -> str:
        return "on" if self.control.ecc(gpu)[1] else "off"

    def write(self, gpu: int, value: str) -> None:
        self.control.set_ecc(gpu, value == "on")


class ComputeMode(GpuActuator):
    field = "compute_mode"

    def current(self, gpu: int) -> str:
        return self.control.compute_mode(gpu)

    def check(self, gpu: int, value: str) -> None:
        if value not in COMPUTE_MODES:
            known = ", ".join(COMPUTE_MODES)
            raise TuningError(f"{setting_name(gpu, self.field)}: {value!r} is not one of {known}")

    def write(self, gpu: int, value: str) -> None:
        self.control.set_compute_mode(gpu, value)


class PowerLimit(GpuActuator):
    field = "power_limit"

    def current(self, gpu: int) -> str:
        return watts_text(self.control.power_limits(gpu).current_watts)

    def wanted(self, gpu: int, target: Any) -> str:
        if target == "default":
            return watts_text(self.control.power_limits(gpu).default_watts)
        if isinstance(target, bool) or not str(target).isdigit():
            raise TuningError(f"gpu.power_limit: {target!r} is not watts or 'default'")
        return str(int(target))

    def check(self, gpu: int, value: str) -> None:
        watts, limits = _mw(float(value)), self.control.power_limits(gpu)
        if not _mw(limits.min_watts) <= watts <= _mw(limits.max_watts):
            low, high = watts_text(limits.min_watts), watts_text(limits.max_watts)
            raise TuningError(f"gpu {gpu}: power limit {value} W is outside the driver's {low}..{high} W")
        enforced = _mw(limits.enforced_watts)
        if enforced < _mw(limits.current_watts) and watts > enforced:
            raise TuningError(
                f"gpu {gpu}: power limit {value} W would not be enforced: another limit caps the GPU "
                f"at {watts_text(limits.enforced_watts)} W"
            )

    def write(self, gpu: int, value: str) -> None:
        self.control.set_power_limit(gpu, float(value))

    def confirm(self, gpu: int, value: str, planned: bool) -> None:
        """An apply must be enforced as set; a rollback is back once the limit as set is (a cap
        that was there before stays)."""
        super().confirm(gpu, value, planned)
        enforced = self.control.power_limits(gpu).enforced_watts
        if planned and _mw(enforced) != _mw(float(value)):
            capped = _mw(enforced) < _mw(float(value))
            why = "a lower limit elsewhere caps the GPU" if capped else "not in force"
            raise TuningError(
                f"gpu {gpu}: power limit set to {value} W but {watts_text(enforced)} W is enforced ({why})"
            )


def gpu_actuators(control: GpuControl, gpus: Sequence[int] | None = None) -> list[Actuator]:
    """The GPU actuators over `gpus` (None: every GPU `control` reaches), in the order an apply
    visits them: persistence first, since limits and locked clocks are driver state it keeps."""
    present = control.gpus()
    chosen = present if gpus is None else list(gpus)
    missing = sorted(set(chosen) - set(present))
    if missing:
        listed = ", ".join(map(str, present)) or "none"
        raise TuningError(f"gpu {', '.join(map(str, missing))}: not on this node (its GPUs: {listed})")
    kinds = (Persistence, PowerLimit, LockedGpuClocks, LockedMemoryClocks, ComputeMode, Ecc)
    return [kind(control, chosen) for kind in kinds]
