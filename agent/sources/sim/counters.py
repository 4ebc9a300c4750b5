"""Cumulative counters of one simulated GPU: energy, ECC, NVLink traffic and errors, XIDs.

Like NVML's, they count from the driver load (days before the agent started), not from zero, and
they only grow: each `SimNode.read` advances them by rate x elapsed time. ECC aggregate counts add
the lifetime counts kept in the InfoROM from earlier boots to this boot's volatile ones.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from agent.sources.gpu import XidCount, XidEvent
from agent.sources.sim.gpu import SimGpu
from agent.sources.sim.profile import XID_CONTAINED_ECC, XID_ROW_REMAP_EVENT, Workload

# An inactive link keeps trying to retrain: each failed attempt counts a recovery, and the
# training traffic on a bad lane counts CRC errors and replays.
DOWN_LINK_ERRORS_PER_SECOND = {"crc": 1.5, "replay": 0.4, "recovery": 0.05}
# What a link that went down has counted by the time the agent first sees it.
DOWN_LINK_ERRORS_AT_START = {"crc": 41, "replay": 7, "recovery": 3}
# A marginal link (a worn connector or cable) stays up and carries traffic, but flits fail their
# CRC and are replayed; it has been counting for a while when the agent starts.
ERRORING_LINK_ERRORS_PER_SECOND = {"crc": 2.0, "replay": 0.5}
ERRORING_LINK_ERRORS_AT_START = {"crc": 180, "replay": 45}


@dataclass(slots=True)
class LinkCounters:
    tx_bytes: float
    rx_bytes: float
    crc_errors: float
    replay_errors: float
    recovery_errors: float


@dataclass(slots=True)
class GpuCounters:
    energy_joules: float
    ecc_corrected_volatile: int
    ecc_corrected_lifetime: int  # earlier boots, from the InfoROM
    pcie_replays: int
    links: list[LinkCounters]
    xid_pending: list[int] = field(default_factory=list)  # raised, not yet seen by a read
    xid_totals: dict[int, int] = field(default_factory=dict)  # seen since the agent started

    @classmethod
    def start(
        cls, gpu: SimGpu, rng: random.Random, crc: list[int], uptime_seconds: float, job: Workload
    ) -> GpuCounters:
        """Counters as they stand when the agent starts, `uptime_seconds` after the driver loaded.

        `crc` holds each link's harmless CRC count from link training. Draws from `rng` do not depend
        on the GPU's condition, so a fault leaves the other GPUs' counters exactly as they were.
        """
        p, c = gpu.profile, gpu.condition
        busy = rng.uniform(0.4, 0.8)  # share of the uptime the node ran jobs
        links = []
        for link in range(p.nvlink_count):
            moved = uptime_seconds * busy * job.nvlink_duty * p.nvlink_bytes_per_second
            errors: dict[str, int] = {}
            if link in c.nvlinks_down:
                errors = DOWN_LINK_ERRORS_AT_START
            elif link in c.nvlinks_erroring:
                errors = ERRORING_LINK_ERRORS_AT_START
            links.append(
                LinkCounters(
                    tx_bytes=moved * rng.uniform(0.98, 1.02),
                    rx_bytes=moved * rng.uniform(0.98, 1.02),
                    crc_errors=crc[link] + errors.get("crc", 0),
                    replay_errors=errors.get("replay", 0),
                    recovery_errors=errors.get("recovery", 0),
                )
            )
        watts = p.idle_power_watts + busy * p.dynamic_power_watts
        counters = cls(
            energy_joules=uptime_seconds * watts * rng.uniform(0.97, 1.03),
            ecc_corrected_volatile=rng.choice((0, 0, 0, 0, 1, 3)),
            # Each row remapped for correctable errors took a few of them to trigger.
            ecc_corrected_lifetime=rng.choice((0, 0, 2, 5, 17)) + 4 * gpu.traits.rows_remapped,
            pcie_replays=rng.choice((0, 0, 0, 0, 0, 1, 3)),
            links=links,
        )
        if c.row_remap_pending:
            # Each uncorrectable error is contained (the process that touched it gets the XID) and
            # its row is marked for remapping at the next reset.
            counters.xid_pending = [XID_CONTAINED_ECC, XID_ROW_REMAP_EVENT] * c.extra_uncorrectable
        counters.xid_pending += c.xids
        return counters

    def advance(self, gpu: SimGpu, seconds: float, power_watts: float, link_rates: list[float]) -> None:
        """Count `seconds` at `power_watts`, each link moving `link_rates[link]` bytes/s each way."""
        self.energy_joules += power_watts * seconds
        for link, (counters, rate) in enumerate(zip(self.links, link_rates, strict=True)):
            counters.tx_bytes += rate * seconds
            counters.rx_bytes += rate * seconds
            if link in gpu.condition.nvlinks_down:
                counters.crc_errors += DOWN_LINK_ERRORS_PER_SECOND["crc"] * seconds
                counters.replay_errors += DOWN_LINK_ERRORS_PER_SECOND["replay"] * seconds
                counters.recovery_errors += DOWN_LINK_ERRORS_PER_SECOND["recovery"] * seconds
            elif link in gpu.condition.nvlinks_erroring:
                counters.crc_errors += ERRORING_LINK_ERRORS_PER_SECOND["crc"] * seconds
                counters.replay_errors += ERRORING_LINK_ERRORS_PER_SECOND["replay"] * seconds

    def take_xids(self, now: float) -> list[XidEvent]:
        """XIDs raised since the last read, stamped `now`; they join the running totals."""
        events = [XidEvent(code, now) for code in self.xid_pending]
        for code in self.xid_pending:
            self.xid_totals[code] = self.xid_totals.get(code, 0) + 1
        self.xid_pending = []
        return events

    def xid_counts(self) -> list[XidCount]:
        return [XidCount(code, total) for code, total in sorted(self.xid_totals.items())]
