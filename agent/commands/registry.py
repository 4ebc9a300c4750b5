"""Command handlers, registered by the `Command` oneof member they serve.

A new command is one file in this package: a `CommandHandler` subclass whose `name` is the oneof
member (e.g. "run_probes"), carrying `@register`. `discover()` imports every module here.
"""

from __future__ import annotations

import importlib
import pkgutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from agent.probes.base import ProbeOutcome, ProbeRunner
from agent.tuning.tuner import Tuner
from protos.gpufleet.v1 import telemetry_pb2 as pb

NOT_HANDLERS = frozenset({"registry", "executor", "memory"})


@dataclass(slots=True)
class CommandContext:
    """What handlers may touch on the agent."""

    probes: ProbeRunner
    deliver_probes: Callable[[Sequence[ProbeOutcome]], None]  # results ride in the next frame, sent at once
    tuner: Tuner | None = None  # None: this agent changes no settings (every ApplyProfile refused)


class CommandHandler(ABC):
    """Runs one kind of command. One instance per agent; it may keep state (e.g. a run in progress)."""

    name: ClassVar[str]  # the Command oneof member it serves
    # Changes the node (tuning, drain): refused when the agent cannot first record on disk that it
    # began, since a restart would then forget it and a repeat could apply it twice.
    mutating: ClassVar[bool] = False

    def __init__(self, ctx: CommandContext) -> None:
        self.ctx = ctx

    @classmethod
    def applies(cls, ctx: CommandContext) -> bool:
        """Whether this agent can serve the command at all (advertised in Hello.capabilities)."""
        return True

    @abstractmethod
    async def run(self, command: pb.Command) -> pb.CommandResult:
        """Run the command; the result's command_id is filled in by the executor."""


REGISTRY: dict[str, type[CommandHandler]] = {}
_H = TypeVar("_H", bound=type[CommandHandler])


def register(cls: _H) -> _H:
    if cls.name in REGISTRY:
        raise ValueError(f"command handler {cls.name!r} registered twice")
    members = {f.name for f in pb.Command.DESCRIPTOR.oneofs_by_name["action"].fields}
    if cls.name not in members:
        raise ValueError(f"command handler {cls.name!r} names no member of Command.action")
    REGISTRY[cls.name] = cls
    return cls


def discover() -> dict[str, type[CommandHandler]]:
    """Import every handler module of this package so their @register lines run; return the registry."""
    import agent.commands as package

    for module in pkgutil.iter_modules(package.__path__):
        if module.name not in NOT_HANDLERS:
            importlib.import_module(f"{package.__name__}.{module.name}")
    return REGISTRY
