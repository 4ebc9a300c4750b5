"""Host OS readings: CPU per core, load, memory, hugepages, network, disks, InfiniBand, PCIe AER."""

from __future__ import annotations

from agent.collectors.base import Collector, PartialRead, register
from agent.snapshot import Snapshot


@register
class HostCollector(Collector):
    name = "host"

    def collect(self, snapshot: Snapshot) -> None:
        if self.ctx.host is None:
            raise RuntimeError("no host source configured")
        snapshot.host = self.ctx.host.read()
        errors = self.ctx.host.last_errors()
        if errors:
            # The readings that parsed are kept; the files that did not are named in the status.
            raise PartialRead("; ".join(errors))
