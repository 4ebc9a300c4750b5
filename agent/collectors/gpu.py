"""Per-GPU readings from the node's GPU source (NVML or the simulator)."""

from __future__ import annotations

from agent.collectors.base import Collector, PartialRead, register
from agent.snapshot import Snapshot
from agent.sources.errors import SourceError


@register
class GpuCollector(Collector):
    name = "gpu"

    def collect(self, snapshot: Snapshot) -> None:
        snapshot.gpus = self.ctx.gpu.read()
        errors = self.ctx.gpu.last_errors()
        if errors and not snapshot.gpus:
            raise SourceError("gpu", "; ".join(errors))
        if errors:
            # Partial success: the GPUs that answered are kept; the rest are named in the status.
            raise PartialRead("; ".join(errors))
