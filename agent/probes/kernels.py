"""Import every kernel module so that agent.probes.kernel.REGISTRY holds them all.

The modules import torch only inside their functions: importing this is cheap and works without
torch (the registry is then complete, and running a kernel says torch is missing).
"""

from __future__ import annotations

from agent.probes import gemm, membw, nccl, pcie
from agent.probes.kernel import REGISTRY, Probe

__all__ = ["ORDER", "REGISTRY", "gemm", "is_node_level", "make", "membw", "names", "nccl", "pcie"]

# The suite's order: compute first (the GPU is coolest), then memory, the link and the collective.
ORDER = ("gemm", "membw", "pcie", "nccl")


def make(name: str) -> Probe:
    """A fresh kernel object for the registered `name`; KeyError names the registered ones."""
    if name not in REGISTRY:
        raise KeyError(f"unknown probe {name!r}; registered: {', '.join(names())}")
    return REGISTRY[name]()


def is_node_level(name: str) -> bool:
    """Whether the registered probe `name` gives one result per node rather than per GPU."""
    return make(name).node_level


def names() -> list[str]:
    """Registered probe names in the suite's order (any others after, by name)."""
    return [n for n in ORDER if n in REGISTRY] + sorted(set(REGISTRY) - set(ORDER))
