"""Whether a GPU may be probed now: pure decisions over GPU readings, no hardware access.

A probe on a GPU that is doing real work would slow that work down and measure nonsense, so a GPU
is refused when it has compute processes other than ours, or is busier than a threshold, unless
the run is forced or the node is drained (nothing of value runs there any more).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from agent.sources.gpu import GpuReading


@dataclass(frozen=True, slots=True)
class SafetyPolicy:
    max_utilization: float = 0.10  # a GPU busier than this (NVML's utilisation ratio) is refused
    drained: bool = False  # the node is drained: probe whatever runs there

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_utilization <= 1.0:
            raise ValueError(f"max_utilization must be within 0..1, not {self.max_utilization}")


def refusals(
    readings: Iterable[GpuReading],
    gpus: Iterable[int],
    policy: SafetyPolicy,
    *,
    own_pids: Collection[int] = (),
    force: bool = False,
) -> dict[int, str]:
    """GPU index -> why it must not be probed now ("refused: ..."), for each of `gpus` refused.

    A GPU without a reading is refused too: nothing says it is idle. `own_pids` are processes of
    this agent (never foreign). `force` or a drained node refuses nothing.
    """
    if force or policy.drained:
        return {}
    by_index = {r.index: r for r in readings}
    out: dict[int, str] = {}
    for gpu in gpus:
        reading = by_index.get(gpu)
        if reading is None:
            out[gpu] = f"refused: GPU {gpu} could not be read, so nothing says it is idle"
            continue
        foreign = sorted({p.pid for p in reading.processes if p.pid not in own_pids})
        utilization = reading.gpu_utilization_ratio
        if foreign:
            pids = ", ".join(str(pid) for pid in foreign[:8]) + (" ..." if len(foreign) > 8 else "")
            out[gpu] = f"refused: GPU {gpu} runs other processes (pid {pids}); force or drain to probe"
        elif utilization is not None and utilization > policy.max_utilization:
            out[gpu] = (
                f"refused: GPU {gpu} is {utilization:.0%} busy (above {policy.max_utilization:.0%}); "
                "force or drain to probe"
            )
    return out
