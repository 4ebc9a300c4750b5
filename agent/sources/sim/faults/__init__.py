"""Faults the simulator can inject, at every level, in one registry (registry.py).

Adding a fault is one function with `@register` in the file of its level (gpu.py, host.py,
network.py, bmc.py), plus the condition field the model reads, plus its twin test.
"""

from agent.sources.sim.faults import bmc, gpu, host, network  # noqa: F401 - their @register lines run
from agent.sources.sim.faults.registry import FAULTS, LEVELS, Fault, FaultSpec, Level, lookup

# Listed by level, then in the order each file registers them.
_ordered = sorted(FAULTS.values(), key=lambda f: LEVELS.index(f.level))
FAULTS.clear()
FAULTS.update((f.name, f) for f in _ordered)

__all__ = ["FAULTS", "LEVELS", "Fault", "FaultSpec", "Level", "lookup"]
