"""The contract every probe kernel implements, and the registry of kernels by name.

A kernel is one file under agent/probes/ (gemm.py, membw.py, pcie.py, nccl.py) that defines a
class implementing `Probe` and registers it with `@register`: its registered name is also its
config key and metric label. Kernels import torch inside their functions, never at module level,
so the agent runs (and reports probes unavailable) where torch is missing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

from agent.probes.base import ProbeOutcome

Suite = Literal["short", "full"]
Mode = Literal["isolated", "concurrent"]


class ProbeError(Exception):
    """A probe could not run or its result is not trustworthy (out of memory, NaN, failed check)."""


@dataclass(frozen=True, slots=True)
class ProbeParams:
    """One run of one variant of one probe."""

    variant: str  # "bf16", "d2d", "h2d", "all_reduce", ...
    device: str  # "cuda:0" (one GPU), "cuda" (node-level: every GPU in `gpus`) or "cpu"
    gpus: tuple[int, ...] = ()  # GPU indices this run uses (node-level probes: every rank's GPU)
    suite: Suite = "short"  # short: the periodic suite (at most 10 s of GPU time per GPU); full: longer
    budget_seconds: float = 10.0  # the most device time this run may take; a kernel sizes its repeats to fit
    mode: Mode = "isolated"  # the runner's choice, recorded in the result
    size: int | None = None  # problem size (gemm: m = n = k; copies: bytes); None: the kernel's default


class Probe(Protocol):
    """A probe kernel. Its class attributes are the probe's facts, declared once, in its file: the
    agent's Hello advertises them (ProbeInfo, see `info_of`) and the controller schedules, stores,
    shows and compares the probe from them, knowing no probe kind by name. Besides `name` and
    `node_level`, a kernel declares (defaults in `info_of` and `mode_of`):

    - `unit: str`: the unit of its value ("TFLOP/s", "GB/s");
    - `higher_is_better: bool`: True for throughput (low is slow), False for latency-like figures;
    - `gpu_variants: tuple[str, ...]`: every variant it may run on a GPU (`variants` says which a
      given device has); the simulator models these;
    - `concurrent: bool`: a per-GPU probe that runs on the node's selected GPUs at once;
    - `budget_share: float`: the share of the suite's time budget per GPU each variant gets;
    - `description: str`: one line for operators.
    """

    name: str  # registered name: gemm, membw, pcie, nccl
    node_level: bool  # True: one result per node (nccl), else one per GPU

    def variants(self, device: str) -> list[str]:
        """The variants this device supports ("cuda:0" or "cpu"), e.g. fp8 only where the GPU has it."""
        ...

    def run(self, params: ProbeParams) -> ProbeOutcome:
        """Run once and return the measured outcome (value, unit, params, duration, check fields).

        Raises ProbeError when it cannot run or the result fails its check. The runner fills in
        `during`, `peak_ratio`, `mode`, `command_id` and the GPU's safety checks.
        """
        ...


@dataclass(frozen=True, slots=True)
class ProbeInfo:
    """A registered probe's declared facts, as the Hello's ProbeInfo carries them."""

    name: str
    unit: str = ""
    higher_is_better: bool = True
    node_level: bool = False
    variants: tuple[str, ...] = ()
    description: str = ""


def mode_of(probe: str, node_level: bool) -> Mode:
    """How the runner schedules `probe` across a node's GPUs. A per-GPU probe declared `concurrent`
    runs on every selected GPU at once: production load runs them all together, which is what exposes
    shared power and thermal limits (gemm). The others run one GPU at a time, so that a GPU's figure
    is its own (membw, pcie: a shared PCIe switch or host memory would mix GPUs up). Node-level
    probes use every GPU at once."""
    kernel = REGISTRY.get(probe)
    return "concurrent" if node_level or bool(getattr(kernel, "concurrent", False)) else "isolated"


def info_of(kernel: Probe) -> ProbeInfo:
    """The facts `kernel` declares (class attributes; a kernel that leaves one out gets its default)."""
    return ProbeInfo(
        name=kernel.name,
        unit=str(getattr(kernel, "unit", "")),
        higher_is_better=bool(getattr(kernel, "higher_is_better", True)),
        node_level=bool(kernel.node_level),
        variants=tuple(getattr(kernel, "gpu_variants", ())),
        description=str(getattr(kernel, "description", "")),
    )


REGISTRY: dict[str, Callable[[], Probe]] = {}
P = TypeVar("P", bound=Probe)


def register(cls: type[P]) -> type[P]:
    """Class decorator: register a kernel under its `name`."""
    REGISTRY[cls.name] = cls
    return cls
