"""Probe runner for the simulator: modelled results that respond to injected faults.

The simulated node reports through the same ProbeOutcome as real probes (marked `simulated`), so
the controller's detection treats both alike.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.probes.base import ProbeOutcome
from agent.sources.sim.node import PROBE_VARIANTS, SimNode


class ModelledProbes:
    def __init__(self, node: SimNode) -> None:
        self.node = node

    def available(self) -> list[str]:
        return list(PROBE_VARIANTS)

    def run(self, probes: Sequence[str], *, force: bool = False) -> list[ProbeOutcome]:
        names = list(probes) or self.available()
        unknown = [n for n in names if n not in PROBE_VARIANTS]
        if unknown:
            raise ValueError(f"unknown probe(s) {', '.join(unknown)}; available: {', '.join(PROBE_VARIANTS)}")
        outcomes: list[ProbeOutcome] = []
        for name in names:
            gpus: list[int | None] = [None] if name == "nccl" else list(range(len(self.node.gpus)))
            for variant in PROBE_VARIANTS[name]:
                outcomes.extend(self.node.probe(name, variant, gpu) for gpu in gpus)
        return outcomes
