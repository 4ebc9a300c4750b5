"""The GPU settings an actuator reads and writes, per GPU index: the contract between the GPU
actuators (agent/tuning/gpu_settings.py) and what sits behind them, NVML on a real node
(agent/sources/nvml/control.py) or the simulated GPU (agent/sources/sim/control.py).

Every method raises TuningError with one line naming the GPU and what failed (no permission, not
supported, outside the constraints); never a foreign exception. Clock values are MHz; clock lock
states are text as the apply journal keeps them: "reset" (not locked), "MIN..MAX", or "unknown"
where the driver cannot say (rolled back to "reset").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

ClockDomain = Literal["gpu", "memory"]
NOT_LOCKED, UNKNOWN = "reset", "unknown"


@dataclass(frozen=True, slots=True)
class PowerLimits:
    """Watts: the management limit as set, the one enforced (the lower of all limits), the board's
    default and the range the driver accepts."""

    current_watts: float
    enforced_watts: float
    default_watts: float
    min_watts: float
    max_watts: float


def clock_text(low: int, high: int) -> str:
    return f"{low}..{high}"


def parse_clock_text(text: str) -> tuple[int, int] | None:
    """ "MIN..MAX" -> (MIN, MAX); "reset" or "unknown" -> None."""
    if text in (NOT_LOCKED, UNKNOWN):
        return None
    low, _, high = text.partition("..")
    return int(low), int(high)


class GpuControl(Protocol):
    def gpus(self) -> list[int]:
        """The GPU indices this control reaches."""
        ...

    def persistence(self, gpu: int) -> bool: ...

    def set_persistence(self, gpu: int, on: bool) -> None: ...

    def power_limits(self, gpu: int) -> PowerLimits: ...

    def set_power_limit(self, gpu: int, watts: float) -> None: ...

    def locked_clocks(self, gpu: int, domain: ClockDomain) -> str:
        """ "reset", "MIN..MAX" or "unknown"."""
        ...

    def supported_clocks(self, gpu: int, domain: ClockDomain) -> list[int]:
        """MHz the domain supports, highest first ([] where the driver does not list them)."""
        ...

    def base_clock(self, gpu: int) -> int | None:
        """The GPU's base SM clock in MHz (None where unknown)."""
        ...

    def lock_clocks(self, gpu: int, domain: ClockDomain, min_mhz: int, max_mhz: int) -> None: ...

    def reset_clocks(self, gpu: int, domain: ClockDomain) -> None: ...

    def compute_mode(self, gpu: int) -> str:
        """ "default", "exclusive_process" or "prohibited"."""
        ...

    def set_compute_mode(self, gpu: int, mode: str) -> None: ...

    def ecc(self, gpu: int) -> tuple[bool, bool]:
        """(current, pending): ECC as it runs now, and as it will after the next reboot."""
        ...

    def set_ecc(self, gpu: int, on: bool) -> None:
        """Sets the pending ECC mode: takes effect at the next reboot."""
        ...

    def close(self) -> None: ...
