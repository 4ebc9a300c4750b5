"""Which faults the demo injects where: seeded, distinct kinds, distinct nodes."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from controller.demo.catalogue import AgentFault


@dataclass(frozen=True, slots=True)
class Injected:
    node: str
    gpu: int | None  # None: a host, network or BMC fault (the node as a whole)
    fault: str
    cause: str = ""  # the cause the controller should report for it (the agent's --list-faults)


def node_names(count: int) -> list[str]:
    width = max(2, len(str(count - 1)))
    return [f"demo-{i:0{width}d}" for i in range(count)]


def plan_faults(
    nodes: list[str],
    gpus_per_node: int,
    faults: int,
    seed: int,
    kinds: Sequence[AgentFault],
    *,
    first: Sequence[str] = (),
) -> list[Injected]:
    """`faults` faults of distinct `kinds` on distinct random nodes, each GPU fault on a random GPU;
    the kinds named in `first` are among them (as many as `faults` allows), the rest drawn."""
    if faults < 0:
        raise ValueError("--faults must be >= 0")
    if faults > len(kinds):
        names = ", ".join(k.name for k in kinds)
        raise ValueError(f"--faults must be at most {len(kinds)} (one of each kind: {names})")
    if faults > len(nodes):
        raise ValueError(f"--faults {faults} needs at least as many nodes (have {len(nodes)})")
    rng = random.Random(f"demo-faults:{seed}")
    preferred = [k for k in kinds if k.name in first]
    if preferred:
        chosen = rng.sample(preferred, min(faults, len(preferred)))
        chosen += rng.sample([k for k in kinds if k not in chosen], faults - len(chosen))
        rng.shuffle(chosen)
    else:  # the draws as they always were: a seed repeats its plan
        chosen = rng.sample(list(kinds), faults)
    targets = rng.sample(nodes, faults)
    return [
        Injected(node, rng.randrange(gpus_per_node) if kind.level == "gpu" else None, kind.name, kind.cause)
        for node, kind in zip(targets, chosen, strict=True)
    ]
