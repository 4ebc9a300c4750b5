"""A probe kind no gpufleet code knows by name: `latency` (lower is better, per GPU, in "us").

It exists only in tests, registered as a new probe file would register it (`latency_registered`),
so tests can show that declaring a probe's facts in its kernel is all a new probe kind takes: the
agent advertises it and the controller schedules, stores, shows and compares it with no edit.
`LatencyProbes` is the simulator's runner plus a modelled latency figure.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator, Sequence

from agent.probes.base import ProbeOutcome
from agent.probes.kernel import REGISTRY, ProbeParams, register
from agent.probes.kernels import names
from agent.sources.sim import SimNode
from agent.sources.sim.probes import ModelledProbes

NAME = "latency"
VARIANT = "launch"
UNIT = "us"
BASE_US = 8.0


class LatencyProbe:
    """A kernel-launch latency probe, as a new file under agent/probes/ would declare it."""

    name = NAME
    node_level = False
    unit = UNIT
    higher_is_better = False
    gpu_variants = (VARIANT,)
    concurrent = False
    description = "kernel launch latency (test-only probe kind)"
    budget_share = 0.05

    def variants(self, device: str) -> list[str]:
        return [VARIANT]

    def run(self, params: ProbeParams) -> ProbeOutcome:
        return ProbeOutcome(NAME, params.variant, None, BASE_US, UNIT, 0.01, 0.0, device=params.device)


@contextlib.contextmanager
def latency_registered() -> Iterator[None]:
    """`latency` in the agent's probe registry for the block, as if its file were in agent/probes/."""
    assert NAME not in REGISTRY
    register(LatencyProbe)
    try:
        yield
    finally:
        del REGISTRY[NAME]


class LatencyProbes(ModelledProbes):
    """The simulator's probes plus `latency`: about BASE_US per GPU with 1% noise, `factor` times
    that on the GPUs in `slow`."""

    def __init__(self, node: SimNode, slow: Sequence[int] = (), factor: float = 1.6) -> None:
        super().__init__(node)
        self.slow = set(slow)
        self.factor = factor
        self.noise = random.Random(node.node)

    def available(self) -> list[str]:
        return [*super().available(), NAME]

    def run(
        self,
        probes: Sequence[str],
        *,
        force: bool = False,
        gpus: Sequence[int] | None = None,
        suite: str = "short",
        command_id: str = "",
    ) -> list[ProbeOutcome]:
        assert NAME in names(), "register the probe first: latency_registered()"
        wanted = list(probes) or self.available()
        others = [p for p in probes if p != NAME]  # empty with no probes asked for: the default suite
        out = []
        if others or not probes:
            out = super().run(others, force=force, gpus=gpus, suite=suite, command_id=command_id)
        if NAME in wanted:
            for gpu in list(gpus or range(len(self.node.gpus))):
                value = (
                    BASE_US * (1.0 + self.noise.gauss(0.0, 0.01)) * (self.factor if gpu in self.slow else 1.0)
                )
                out.append(
                    ProbeOutcome(
                        NAME,
                        VARIANT,
                        gpu,
                        round(value, 3),
                        UNIT,
                        0.05,
                        self.node.clock(),
                        simulated=True,
                        mode="isolated",
                        device=f"cuda:{gpu}",
                        command_id=command_id,
                    )
                )
        return out
