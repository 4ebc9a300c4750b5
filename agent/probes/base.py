"""The probe contract: what a probe run returns and what runs probes for the agent."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from agent.sources.gpu import GpuReading


@dataclass(slots=True)
class ProbeOutcome:
    """One probe result on one GPU (gpu=None: node-level). Field names match the wire's ProbeResult."""

    probe: str
    variant: str
    gpu: int | None
    value: float
    unit: str
    duration_seconds: float
    time: float
    error: str = ""
    params: dict[str, str] = field(default_factory=dict)
    peak_ratio: float | None = None
    during: GpuReading | None = None
    simulated: bool = False
    mode: str = ""  # "concurrent" (the node's GPUs at once) or "isolated" (one at a time)
    check_passed: bool | None = None  # correctness check against a higher-precision reference
    check_relative_error: float | None = None
    device: str = ""  # what ran it: "cuda:0", "cpu"
    command_id: str = ""  # the RunProbes command this answers


class ProbeRunner(Protocol):
    """Runs the agent's probes on request (a RunProbes command); blocking, called off the event loop."""

    def available(self) -> list[str]:
        """Registered names of the probes this node can run (empty: none, e.g. torch missing)."""
        ...

    def run(
        self,
        probes: Sequence[str],
        *,
        force: bool = False,
        gpus: Sequence[int] | None = None,
        suite: str = "short",
        command_id: str = "",
    ) -> list[ProbeOutcome]:
        """Run the named probes (empty: the default suite) on `gpus` (None or empty: every GPU).

        `suite` is "short" (the periodic one: at most 10 s of GPU time per GPU) or "full"; `force`
        probes GPUs the safety checks would refuse. Every outcome carries `command_id`. Failures and
        refusals come back as outcomes with `error`; unknown probes, GPUs or suites raise ValueError.
        """
        ...

    def close(self) -> None:
        """Stop a run in progress from another thread (the agent shutting down); `run` then returns
        what it has. Safe to call more than once, and when nothing runs."""
        ...


class NoProbes:
    """The runner for an agent that cannot probe: it says so instead of pretending."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def available(self) -> list[str]:
        return []

    def run(
        self,
        probes: Sequence[str],
        *,
        force: bool = False,
        gpus: Sequence[int] | None = None,
        suite: str = "short",
        command_id: str = "",
    ) -> list[ProbeOutcome]:
        raise RuntimeError(f"probes unavailable: {self.reason}")

    def close(self) -> None:
        """Nothing runs, nothing to stop."""
