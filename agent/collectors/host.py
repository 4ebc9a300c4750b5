"""Host OS readings (CPU, load, memory, governor, uptime)."""

from __future__ import annotations

from agent.collectors.base import Collector, register
from agent.snapshot import Snapshot


@register
class HostCollector(Collector):
    name = "host"

    def collect(self, snapshot: Snapshot) -> None:
        if self.ctx.host is None:
            raise RuntimeError("no host source configured")
        snapshot.host = self.ctx.host.read()
