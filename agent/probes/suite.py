"""A probe run's plan: which variant runs where, in what mode, with how much of the time budget.

Pure data, no torch: the worker process (agent/probes/worker.py) plans with the variants its
devices support, and the tests check the arithmetic. Each variant gets a share of the suite's
budget per GPU (10 s for the short suite); shares are scaled down so that at most 90% of the budget
is planned, the rest absorbing a kernel's overrun (a kernel may end up to a few calls past its
deadline). A node-level probe's time counts against every GPU it uses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from agent.probes.kernel import Mode, mode_of
from agent.probes.kernels import REGISTRY, names

SUITE_BUDGET_SECONDS = {"short": 10.0, "full": 60.0}  # per GPU; the agent's config may change them
DEFAULT_SHARE = 0.10  # for a kernel that declares no `budget_share`


def share_of(probe: str) -> float:
    """The share of the budget each variant of `probe` gets, as its kernel declares it."""
    return float(getattr(REGISTRY.get(probe), "budget_share", DEFAULT_SHARE))


SHARES = {name: share_of(name) for name in names()}  # the registered kernels' shares, per variant
PLANNED = 0.9
MIN_STEP_SECONDS = 0.05  # below this a step cannot warm up and measure: it is skipped instead


@dataclass(frozen=True, slots=True)
class Step:
    probe: str
    variant: str
    devices: tuple[str, ...]  # per-GPU probes: one result per device; node-level: the devices it spans
    node_level: bool
    mode: Mode
    budget_seconds: float


def plan(
    probes: Sequence[str],
    devices: Sequence[str],
    variants: Callable[[str, str], list[str]],
    node_level: Mapping[str, bool],
    budget_seconds: float,
) -> list[Step]:
    """Steps for `probes` on `devices` ("cuda:0", ... or "cpu"); `variants(probe, device)` lists what runs.

    Per-GPU probes get one step per variant over the devices that support it (the variant's devices
    run at once or one after another, as `mode_of` says); node-level probes one step per variant
    over every device.
    """
    if budget_seconds <= 0:
        raise ValueError(f"the budget must be > 0 seconds, not {budget_seconds}")
    drafts: list[tuple[str, str, tuple[str, ...], bool]] = []
    for probe in probes:
        if node_level[probe]:
            whole = "cpu" if list(devices) == ["cpu"] else "cuda"
            drafts.extend((probe, v, tuple(devices), True) for v in variants(probe, whole))
            continue
        order: list[str] = []
        supported: dict[str, list[str]] = {}
        for device in devices:
            for variant in variants(probe, device):
                if variant not in supported:
                    order.append(variant)
                supported.setdefault(variant, []).append(device)
        drafts.extend((probe, v, tuple(supported[v]), False) for v in order)
    load: dict[str, float] = {}
    for probe, _, on, _ in drafts:
        for device in on:
            load[device] = load.get(device, 0.0) + share_of(probe)
    scale = min(1.0, PLANNED / max(load.values())) if load else 1.0
    return [
        Step(
            probe,
            variant,
            on,
            whole,
            mode_of(probe, whole),
            budget_seconds * share_of(probe) * scale,
        )
        for probe, variant, on, whole in drafts
    ]


@dataclass
class Ledger:
    """Device time spent per device against the suite's budget."""

    budget_seconds: float
    spent: dict[str, float] = field(default_factory=dict)

    def allowance(self, step: Step) -> float:
        """The step's budget, cut to what its most-used device has left (0: nothing left)."""
        left = min(self.budget_seconds - self.spent.get(d, 0.0) for d in step.devices)
        return max(0.0, min(step.budget_seconds, left))

    def charge(self, devices: Sequence[str], seconds: float) -> None:
        for device in devices:
            self.spent[device] = self.spent.get(device, 0.0) + seconds
