"""The event loop the controller's processes run on (the controller and its ingest fronts).

`auto` (the default) is uvloop's loop, libuv in C, where uvloop is installed, and asyncio's own
otherwise; `uvloop` asks for it (an error where it is not installed); `asyncio` for asyncio's own.
At 2,000 nodes uvloop took the controller's main process from 1.72-1.89 to 1.61-1.72 ms of CPU a
frame (bench/results/2026-11-30_controller_scale_uvloop.txt): what the controller's own code asks
of the loop (its turns, handles, futures' callbacks, pipe writes), which asyncio runs in Python.
gRPC's transport costs the same on either (a bare server that only acks: 0.65-0.66 ms a frame).

uvloop's transports are its own classes, not asyncio's (write_transport and read_transport check
what the code uses instead). The controller's processes are not started by the loop's own
subprocess functions but by children.py: uvloop's fork the controller with at-fork handlers."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar, cast

EventLoop = Literal["auto", "uvloop", "asyncio"]
CHOICES: tuple[EventLoop, ...] = ("auto", "uvloop", "asyncio")
ENV = "GPUFLEET_EVENT_LOOP"  # how the controller tells its fronts which loop it runs (fronts/relay.py)
T = TypeVar("T")


class NoUvloop(RuntimeError):
    """`event_loop: uvloop` where uvloop is not installed."""


def factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The new-loop function for `choice` (None: asyncio's own)."""
    if choice not in CHOICES:
        raise ValueError(f"event_loop must be one of {', '.join(CHOICES)}, not {choice!r}")
    if choice == "asyncio":
        return None
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        if choice == "uvloop":
            raise NoUvloop("event_loop is uvloop, and uvloop is not installed (pip install uvloop)") from None
        return None
    return cast(Callable[[], asyncio.AbstractEventLoop], uvloop.new_event_loop)


def run(main: Coroutine[Any, Any, T], choice: str = "auto") -> T:
    """asyncio.run(main) on the loop `choice` names."""
    try:
        new_loop = factory(choice)
    except (ValueError, NoUvloop):
        main.close()  # never awaited: no warning for it
        raise
    with asyncio.Runner(loop_factory=new_loop) as runner:
        return runner.run(main)


def kind(loop: asyncio.AbstractEventLoop | None = None) -> Literal["uvloop", "asyncio"]:
    """Which loop this is (the running one by default)."""
    loop = loop or asyncio.get_running_loop()
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def write_transport(transport: asyncio.BaseTransport | None) -> asyncio.WriteTransport:
    """`transport` as a write transport, asyncio's or uvloop's; TypeError if it cannot write."""
    if not all(callable(getattr(transport, m, None)) for m in ("write", "get_write_buffer_size")):
        raise TypeError(f"not a write transport: {transport!r}")
    return cast(asyncio.WriteTransport, transport)


def read_transport(transport: asyncio.BaseTransport | None) -> asyncio.ReadTransport | None:
    """`transport` as a read transport (it can pause and resume reading), or None."""
    if all(callable(getattr(transport, m, None)) for m in ("pause_reading", "resume_reading")):
        return cast(asyncio.ReadTransport, transport)
    return None
