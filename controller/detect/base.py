"""The detector contract and registry.

A detector is a pure function of the fleet: it reads state and returns findings, touching nothing.
A new detector is one file in this package with `@register`; its name is also its config key.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field

from controller.config import DetectConfig
from controller.fleet.finding import Finding
from controller.fleet.majority import groups
from controller.fleet.model import Fleet, NodeState


@dataclass(frozen=True, slots=True)
class DetectContext:
    fleet: Fleet
    config: DetectConfig
    now: float
    memo: dict[str, object] = field(default_factory=dict, compare=False)  # shared within one pass


def peer_groups(ctx: DetectContext) -> dict[str, list[NodeState]]:
    """The fleet's nodes by peer group (fleet/majority.py groups), worked out once per pass for the
    detectors that compare a node with its group."""
    found = ctx.memo.get("peer_groups")
    if found is None:
        found = ctx.memo["peer_groups"] = groups(ctx.fleet.nodes.values())
    return found  # type: ignore[return-value]


DetectFn = Callable[[DetectContext], list[Finding]]

REGISTRY: dict[str, DetectFn] = {}


def register(name: str) -> Callable[[DetectFn], DetectFn]:
    def wrap(fn: DetectFn) -> DetectFn:
        if name in REGISTRY:
            raise ValueError(f"detector {name!r} registered twice")
        REGISTRY[name] = fn
        return fn

    return wrap


_NOT_DETECTORS = {
    "base",
    "clock_peers",
    "drift_values",
    "finding",
    "explain",
    "infiniband_ports",
    "offline",
    "own_history",
    "per_gpu",
    "per_node",
    "runner",
    "stats",
    "xid_catalogue",
}


def discover() -> dict[str, DetectFn]:
    """Import every detector module of this package so their @register lines run."""
    import controller.detect as package

    for module in pkgutil.iter_modules(package.__path__):
        if module.name not in _NOT_DETECTORS:
            importlib.import_module(f"{package.__name__}.{module.name}")
    return REGISTRY
