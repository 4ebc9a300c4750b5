"""Which faults the demo injects where: seeded, distinct kinds, distinct nodes."""

from __future__ import annotations

import random
from dataclasses import dataclass

# Faults the agent's simulator can inject (agent/sources/sim/faults.py; a test keeps the two in step).
INJECTABLE = (
    "thermal_throttle",
    "power_brake",
    "power_cap",
    "clocks_locked_low",
    "pcie_downtrained",
    "nvlink_down",
    "ecc_row_remap_pending",
    "hbm_degraded",
)


@dataclass(frozen=True, slots=True)
class Injected:
    node: str
    gpu: int | None
    fault: str


def node_names(count: int) -> list[str]:
    width = max(2, len(str(count - 1)))
    return [f"demo-{i:0{width}d}" for i in range(count)]


def plan_faults(nodes: list[str], gpus_per_node: int, faults: int, seed: int) -> list[Injected]:
    """`faults` faults of distinct kinds on distinct random nodes, each on a random GPU."""
    if faults < 0:
        raise ValueError("--faults must be >= 0")
    if faults > len(INJECTABLE):
        raise ValueError(
            f"--faults must be at most {len(INJECTABLE)} (one of each kind: {', '.join(INJECTABLE)})"
        )
    if faults > len(nodes):
        raise ValueError(f"--faults {faults} needs at least as many nodes (have {len(nodes)})")
    rng = random.Random(f"demo-faults:{seed}")
    kinds = rng.sample(INJECTABLE, faults)
    targets = rng.sample(nodes, faults)
    return [
        Injected(node, rng.randrange(gpus_per_node), kind) for node, kind in zip(targets, kinds, strict=True)
    ]
