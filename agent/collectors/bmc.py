"""The BMC's latest poll (Redfish, or the simulator's BMC), taken from the poller without waiting.

The poller reads the BMC on its own cadence in its own thread; this collector only picks up what it
has. The snapshot always holds the latest sample (the exporter shows it); `bmc_new` marks the one
cycle after a poll completes, so the stream sends each poll once.
"""

from __future__ import annotations

from agent.collectors.base import Collector, CollectorContext, PartialRead, register
from agent.snapshot import Snapshot
from agent.sources.errors import SourceError


@register
class BmcCollector(Collector):
    name = "bmc"

    @classmethod
    def applies(cls, ctx: CollectorContext) -> bool:
        return ctx.bmc is not None

    def collect(self, snapshot: Snapshot) -> None:
        if self.ctx.bmc is None:
            raise RuntimeError("no BMC configured")
        sample, new = self.ctx.bmc.take()
        snapshot.bmc, snapshot.bmc_new = sample, new
        if sample is None:
            return  # the first poll has not finished yet
        if sample.error:
            raise SourceError("bmc", sample.error)
        failed = [s for s in sample.sections if not s.success]
        if failed:
            raise PartialRead("; ".join(f"{s.name}: {s.error}" for s in failed))
