"""The one list of faults the simulator can inject, at every level, and the --fault syntax.

A fault is registered where it is defined (`@register` in gpu.py, host.py, network.py, bmc.py of
this package) with its name, its level, what it looks like, the cause the controller should report
(a protos Cause name) and the telemetry fields it shows in. Its apply function changes only the
condition of what it hits (a GPU, the host, the BMC); the physical models turn that into readings.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, get_args

from protos.names import CAUSES

Level = Literal["gpu", "host", "network", "bmc"]
LEVELS: tuple[Level, ...] = get_args(Level)

T = TypeVar("T")
# apply(what the fault hits, the target after ':' or None (pick one with rng), rng)
Apply = Callable[[T, str | None, random.Random], None]


@dataclass(frozen=True, slots=True)
class Target:
    """What may follow ':' in --fault: a GPU index (no choices) or one of `choices`."""

    name: str  # as the syntax shows it: "GPU", "PORT", "FAN", "PSU", "ATTRIBUTE"
    choices: tuple[str, ...] = ()

    def check(self, fault: str, text: str) -> str:
        if not self.choices:
            if not text.isdigit():
                raise ValueError(f"fault {fault}: the {self.name} after ':' must be an index, not {text!r}")
            return str(int(text))
        if text not in self.choices:
            raise ValueError(
                f"fault {fault}: unknown {self.name} {text!r}; expected one of {', '.join(self.choices)}"
            )
        return text


@dataclass(frozen=True, slots=True)
class Fault:
    name: str
    level: Level
    cause: str
    description: str
    shows_in: tuple[str, ...]  # telemetry fields a real node moves (contract names; probe.KIND for probes)
    target: Target | None  # None: the fault takes nothing after ':'
    apply: Apply[Any]

    @property
    def syntax(self) -> str:
        return self.name if self.target is None else f"{self.name}[:{self.target.name}]"

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "level": self.level,
            "cause": self.cause,
            "description": self.description,
            "target": None if self.target is None else self.target.name.lower(),
            "choices": [] if self.target is None else list(self.target.choices),  # empty: an index
            "shows_in": list(self.shows_in),
        }


FAULTS: dict[str, Fault] = {}


def register(
    name: str,
    level: Level,
    *,
    cause: str,
    description: str,
    shows_in: tuple[str, ...],
    target: Target | None = None,
) -> Callable[[Apply[T]], Apply[T]]:
    """Register the decorated apply function as fault `name`."""
    if name in FAULTS:
        raise ValueError(f"fault {name!r} registered twice")
    if level not in LEVELS:
        raise ValueError(f"fault {name!r}: unknown level {level!r}")
    if cause not in CAUSES:
        raise ValueError(f"fault {name!r}: {cause!r} is not a cause of the contract")

    def wrap(fn: Apply[T]) -> Apply[T]:
        FAULTS[name] = Fault(name, level, cause, description, shows_in, target, fn)
        return fn

    return wrap


def lookup(name: str) -> Fault:
    fault = FAULTS.get(name)
    if fault is None:
        raise ValueError(f"unknown fault {name!r}; the simulator knows {', '.join(FAULTS)}")
    return fault


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """A fault to inject: `target` None lets the simulator pick one (seeded).

    The target is a GPU index for GPU faults, else a name (an InfiniBand port, a fan, a BIOS
    attribute); faults that hit the whole host or BMC take none.
    """

    fault: str
    target: int | str | None = None

    def __post_init__(self) -> None:
        fault = lookup(self.fault)
        if self.target is None:
            return
        if fault.target is None:
            raise ValueError(f"fault {self.fault} ({fault.level} level) takes no target, not {self.target!r}")
        fault.target.check(self.fault, str(self.target))

    @classmethod
    def parse(cls, text: str) -> FaultSpec:
        """Parse "NAME" or "NAME:TARGET", as the --fault flag takes it."""
        name, sep, target = text.partition(":")
        fault = lookup(name)
        if not sep:
            return cls(name)
        if fault.target is None:
            raise ValueError(f"fault {name} ({fault.level} level) takes no target after ':' ({text!r})")
        checked = fault.target.check(name, target)
        return cls(name, int(checked) if not fault.target.choices else checked)

    @property
    def level(self) -> Level:
        return lookup(self.fault).level

    @property
    def gpu(self) -> int | None:
        """The GPU index of a GPU fault (None: any); None for other levels."""
        if self.level != "gpu" or self.target is None:
            return None
        return int(self.target)

    def text(self) -> str:
        return self.fault if self.target is None else f"{self.fault}:{self.target}"


def pick(target: str | None, choices: tuple[str, ...], rng: random.Random) -> str:
    """The target asked for, else one of `choices` drawn from `rng`."""
    return target if target is not None else rng.choice(choices)
