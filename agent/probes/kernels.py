"""Import every kernel module so that agent.probes.kernel.REGISTRY holds them all.

A kernel module is any module of this package not named in NOT_KERNELS: adding a probe kind is one
new file with an `@register` class, and nothing here changes. The modules import torch only inside
their functions: importing this is cheap and works without torch (the registry is then complete,
and running a kernel says torch is missing).
"""

from __future__ import annotations

import importlib
import pkgutil

from agent.probes.kernel import REGISTRY, Probe, ProbeInfo, info_of

__all__ = ["ORDER", "REGISTRY", "info", "infos", "is_node_level", "make", "names"]

# Modules of agent.probes that are not kernels (the worker's helpers import torch at module level).
NOT_KERNELS = frozenset(
    {
        "base",
        "datasheet",
        "kernel",
        "kernels",
        "nccl_worker",
        "runner",
        "safety",
        "sampling",
        "suite",
        "timing",
        "worker",
        "worker_client",
    }
)

# The suite's order: compute first (the GPU is coolest), then memory, the link and the collective.
# Probe kinds not named here run after these, by name.
ORDER = ("gemm", "membw", "pcie", "nccl")


def _discover() -> None:
    import agent.probes as package

    for module in pkgutil.iter_modules(package.__path__):
        if module.name not in NOT_KERNELS and not module.name.startswith("_"):
            importlib.import_module(f"{package.__name__}.{module.name}")


_discover()


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


def info(name: str) -> ProbeInfo:
    """The declared facts of `name`; a name no kernel registers gets only its name (and defaults)."""
    return info_of(make(name)) if name in REGISTRY else ProbeInfo(name=name)


def infos(offered: list[str] | None = None) -> list[ProbeInfo]:
    """The facts of the `offered` probes (None: every registered one), in that order."""
    return [info(n) for n in (names() if offered is None else offered)]
