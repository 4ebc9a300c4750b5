"""The locked-clock actuators (GPU and memory clocks): "reset" or "MIN..MAX" MHz, with the
profile's `base` (the GPU's base clock) and `max` (its highest supported clock) resolved per GPU.

Locks the driver cannot report read "unknown": such a GPU is always written, and a lock planned
over it snapshots "reset", so that a rollback (or a recovery in a later process) unlocks the
clocks rather than leave them locked.
"""

from __future__ import annotations

from typing import Any

from agent.tuning.base import TuningError
from agent.tuning.gpu_actuator import GpuActuator
from agent.tuning.gpu_control import NOT_LOCKED, UNKNOWN, ClockDomain, clock_text, parse_clock_text


class LockedClocks(GpuActuator):
    domain: ClockDomain = "gpu"

    def current(self, gpu: int) -> str:
        return self.control.locked_clocks(gpu, self.domain)

    def wanted(self, gpu: int, target: Any) -> str:
        if target == NOT_LOCKED:
            return NOT_LOCKED
        if isinstance(target, str) or len(target) != 2:
            raise TuningError(f"gpu.{self.field}: {target!r} is not (min, max) or 'reset'")
        low, high = (self.resolve(gpu, bound) for bound in target)
        return clock_text(low, high)

    def resolve(self, gpu: int, bound: Any) -> int:
        if bound == "max":
            supported = self.control.supported_clocks(gpu, self.domain)
            if not supported:
                raise TuningError(f"gpu {gpu}: 'max' unknown: the driver lists no {self.domain} clocks")
            return max(supported)
        if bound == "base":
            base = self.control.base_clock(gpu) if self.domain == "gpu" else None
            if base is None:
                why = "not known for this GPU" if self.domain == "gpu" else "a GPU clock, not a memory one"
                raise TuningError(f"gpu {gpu}: 'base' is {why}: give {self.field} in MHz")
            return base
        if isinstance(bound, bool) or not isinstance(bound, int) or bound <= 0:
            raise TuningError(f"gpu.{self.field}: {bound!r} is not MHz, 'base' or 'max'")
        return bound

    def snapshot(self, gpu: int, current: str, wanted: str) -> str | None:
        if current == UNKNOWN:
            return UNKNOWN if wanted == NOT_LOCKED else NOT_LOCKED
        return super().snapshot(gpu, current, wanted)

    def check(self, gpu: int, value: str) -> None:
        bounds = parse_clock_text(value)
        if bounds is None:
            return
        low, high = bounds
        if low > high:
            raise TuningError(f"gpu {gpu}: locked {self.domain} clocks {value}: min is above max")
        supported = self.control.supported_clocks(gpu, self.domain)
        if supported and not min(supported) <= low <= high <= max(supported):
            raise TuningError(
                f"gpu {gpu}: locked {self.domain} clocks {value} MHz are outside the supported "
                f"{min(supported)}..{max(supported)} MHz"
            )

    def write(self, gpu: int, value: str) -> None:
        bounds = parse_clock_text(value)
        if bounds is None:  # "reset", or the "unknown" a rollback restores: unlocked
            self.control.reset_clocks(gpu, self.domain)
        else:
            self.control.lock_clocks(gpu, self.domain, *bounds)

    def confirm(self, gpu: int, value: str, planned: bool) -> None:
        if value == UNKNOWN and self.current(gpu) in (NOT_LOCKED, UNKNOWN):
            return
        super().confirm(gpu, value, planned)


class LockedGpuClocks(LockedClocks):
    field = "locked_gpu_clocks"


class LockedMemoryClocks(LockedClocks):
    field = "locked_memory_clocks"
    domain = "memory"
