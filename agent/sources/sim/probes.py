"""Probe runner for the simulator: modelled results that respond to injected faults.

The simulated node reports through the same ProbeOutcome as real probes (marked `simulated`), so
the controller's detection treats both alike. It honours the same request as TorchProbes: the
GPUs asked for (nccl across them, when there are two or more; the default suite leaves nccl out
otherwise), the suite's name, the command id, and each result's mode. It models a probe on an idle
GPU and refuses none: the controller's scheduler picks idle GPUs from telemetry before asking.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.probes.base import ProbeOutcome
from agent.probes.kernel import mode_of
from agent.probes.kernels import infos
from agent.sources.sim.node import PROBE_VARIANTS, SimNode

NODE_LEVEL = frozenset(i.name for i in infos(list(PROBE_VARIANTS)) if i.node_level)
SUITES = ("short", "full")


class ModelledProbes:
    def __init__(self, node: SimNode) -> None:
        self.node = node

    def available(self) -> list[str]:
        return list(PROBE_VARIANTS)

    def close(self) -> None:
        """Modelled runs are instant: nothing to stop."""

    def run(
        self,
        probes: Sequence[str],
        *,
        force: bool = False,
        gpus: Sequence[int] | None = None,
        suite: str = "short",
        command_id: str = "",
    ) -> list[ProbeOutcome]:
        names = list(probes) or self.available()
        unknown = [n for n in names if n not in PROBE_VARIANTS]
        if unknown:
            raise ValueError(f"unknown probe(s) {', '.join(unknown)}; available: {', '.join(PROBE_VARIANTS)}")
        if suite not in SUITES:
            raise ValueError(f"unknown suite {suite!r}; known: {', '.join(SUITES)}")
        count = len(self.node.gpus)
        selected = list(dict.fromkeys(gpus)) if gpus else list(range(count))
        outside = [g for g in selected if not 0 <= g < count]
        if outside:
            raise ValueError(f"no GPU {', '.join(map(str, outside))} on this node (it has 0..{count - 1})")
        if not probes and len(selected) < 2:
            names = [n for n in names if n not in NODE_LEVEL]
        outcomes: list[ProbeOutcome] = []
        for name in names:
            node_level = name in NODE_LEVEL
            for variant in PROBE_VARIANTS[name]:
                if node_level and len(selected) < 2:
                    outcomes.append(_too_few(name, variant, len(selected), self.node.clock()))
                elif node_level:
                    outcomes.append(self.node.probe(name, variant, None, ranks=selected))
                else:
                    outcomes.extend(self.node.probe(name, variant, gpu) for gpu in selected)
        for outcome in outcomes:
            outcome.mode = mode_of(outcome.probe, outcome.probe in NODE_LEVEL)
            outcome.device = "cuda" if outcome.gpu is None else f"cuda:{outcome.gpu}"
            outcome.command_id = command_id
            if outcome.gpu is None and gpus:
                outcome.params["gpus"] = ",".join(map(str, selected))
        return outcomes


def _too_few(probe: str, variant: str, selected: int, now: float) -> ProbeOutcome:
    return ProbeOutcome(
        probe=probe,
        variant=variant,
        gpu=None,
        value=0.0,
        unit="",
        duration_seconds=0.0,
        time=now,
        error=f"{probe} needs 2 or more GPUs; {selected} selected",
        simulated=True,
    )
