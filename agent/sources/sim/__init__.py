"""The simulated GPU node: the same GpuSource contract as NVML, with physically modelled faults."""

from agent.sources.sim.faults import FAULTS, FaultSpec
from agent.sources.sim.host import HostCondition, SimHost
from agent.sources.sim.node import SimNode

__all__ = ["FAULTS", "FaultSpec", "HostCondition", "SimHost", "SimNode"]
