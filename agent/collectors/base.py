"""The collector contract and registry.

A collector reads one source and fills its section of the cycle's Snapshot. The daemon runs each
in a guard: one failing collector is reported (success false, its error) and never breaks a cycle.
A new collector is one file in this package carrying `@register`; `discover()` imports them all.
"""

from __future__ import annotations

import importlib
import pkgutil
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from agent.snapshot import Snapshot
from agent.sources.bmc_poller import BmcPoller
from agent.sources.gpu import GpuSource
from agent.sources.host import HostReader


@dataclass(slots=True)
class CollectorContext:
    """What collectors may read. Sources are shared and owned by the daemon."""

    gpu: GpuSource
    host: HostReader | None
    bmc: BmcPoller | None = None  # None: no BMC configured


class PartialRead(Exception):
    """Part of a collector's section was read and kept in the snapshot; the rest failed."""


class Collector(ABC):
    name: ClassVar[str]

    def __init__(self, ctx: CollectorContext) -> None:
        self.ctx = ctx

    @classmethod
    def applies(cls, ctx: CollectorContext) -> bool:
        """Whether this node has what the collector reads (no BMC configured: no BMC collector)."""
        return True

    @abstractmethod
    def collect(self, snapshot: Snapshot) -> None:
        """Fill this collector's section of `snapshot`; raise on failure (SourceError preferred)."""

    def close(self) -> None:  # noqa: B027 - optional hook; most collectors hold nothing
        """Release anything the collector holds itself (sources are closed by their owner)."""


REGISTRY: dict[str, type[Collector]] = {}
_C = TypeVar("_C", bound=type[Collector])


def register(cls: _C) -> _C:
    if cls.name in REGISTRY:
        raise ValueError(f"collector {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls
    return cls


def discover() -> dict[str, type[Collector]]:
    """Import every module of this package so their @register lines run; return the registry."""
    import agent.collectors as package

    for module in pkgutil.iter_modules(package.__path__):
        if module.name != "base":
            importlib.import_module(f"{package.__name__}.{module.name}")
    return REGISTRY
