"""The detector contract and registry.

A detector is a pure function of the fleet: it reads state and returns findings, touching nothing.
A new detector is one file in this package with `@register`; its name is also its config key.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass

from controller.config import DetectConfig
from controller.fleet.finding import Finding
from controller.fleet.model import Fleet


@dataclass(frozen=True, slots=True)
class DetectContext:
    fleet: Fleet
    config: DetectConfig
    now: float


DetectFn = Callable[[DetectContext], list[Finding]]

REGISTRY: dict[str, DetectFn] = {}


def register(name: str) -> Callable[[DetectFn], DetectFn]:
    def wrap(fn: DetectFn) -> DetectFn:
        if name in REGISTRY:
            raise ValueError(f"detector {name!r} registered twice")
        REGISTRY[name] = fn
        return fn

    return wrap


_NOT_DETECTORS = {"base", "finding", "explain", "offline", "own_history", "runner", "stats", "xid_catalogue"}


def discover() -> dict[str, DetectFn]:
    """Import every detector module of this package so their @register lines run."""
    import controller.detect as package

    for module in pkgutil.iter_modules(package.__path__):
        if module.name not in _NOT_DETECTORS:
            importlib.import_module(f"{package.__name__}.{module.name}")
    return REGISTRY
