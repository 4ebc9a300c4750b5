"""The agent's sources from its config: NVML with the real host and probes, or the simulator."""

from __future__ import annotations

from agent.config import AgentConfig
from agent.probes.base import ProbeRunner
from agent.sources.gpu import GpuSource
from agent.sources.host import HostReader
from agent.sources.linux.source import HostSource


def build_sources(config: AgentConfig) -> tuple[GpuSource, HostReader, ProbeRunner]:
    """The GPU source, host and probe runner the config asks for; SourceError if NVML cannot start.

    The simulator brings its own host (SimHost, driven by the node's load) and modelled probes;
    NVML goes with the real host under `host_root` and real probes where torch sees the GPUs
    (else a runner that says why not).
    """
    if config.source == "sim":
        from agent.sources.sim import SimHost, SimNode
        from agent.sources.sim.probes import ModelledProbes

        sim = config.sim
        node = SimNode(
            config.node,
            gpus=sim.gpus,
            seed=sim.seed,
            load=sim.load,
            faults=[f.spec() for f in sim.faults],
            idle_every_seconds=sim.idle_every_seconds,
            idle_seconds=sim.idle_seconds,
        )
        return node, SimHost(node, seed=sim.seed), ModelledProbes(node)
    from agent.compose.probes import real_probes
    from agent.sources.nvml.source import NvmlSource

    source = NvmlSource(slow_every=config.nvml.slow_every_cycles, xid_events=config.nvml.xid_events)
    return source, HostSource(config.host_root), real_probes(config.probes)
