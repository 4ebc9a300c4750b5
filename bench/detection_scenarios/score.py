"""Scoring what a method raised (the controller's findings, or the static rule's flags) against
what was injected.

Matching: an event matches an injection on the same node when their GPUs agree or either is
node-level (a node-level finding about a GPU fault's node, or a GPU finding on a node with a host
fault), and it opened within the fault's window: from onset to its end plus GRACE (to the run's
end for a lasting fault). Units:

- precision: over distinct locations (scenario, node, GPU) something opened at, as
  controller/demo/score.py counts them; a location is right when its first event matches a fault.
  `false_opens` counts every event that matches none (flaps after a fault ended included).
- recall: over injections; detected when a matching event opened. `recall_slow` counts only faults
  that slow a GPU by >= 5% (severity.SLOW), `recall_all` every fault.
- cause accuracy: of detected faults, those with a matching finding of the injected fault's cause.
- time to detect: frames from onset to the first matching event (the run's step per frame).
- churn: matching events per detected fault (1.0: one finding per fault, no flapping).
- throttle seconds: onset to the first matching event, for faults that show in clock event
  reasons (the registry's shows_in) and slow the GPU by >= 5%; a miss counts as never.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.sources.sim.faults import FAULTS
from detection_scenarios.drive import Event, Run
from detection_scenarios.scenarios import Injection
from detection_scenarios.severity import SLOW

GRACE = 120.0  # seconds after an intermittent fault ends in which an event still counts as its
THROTTLE_FIELD = "clock_event_reasons"


def matches(event: Event, injection: Injection, run_seconds: float) -> bool:
    if event.node != injection.node:
        return False
    if event.gpu is not None and injection.gpu is not None and event.gpu != injection.gpu:
        return False
    end = run_seconds if injection.end is None else injection.end + GRACE
    return injection.onset <= event.time <= end


@dataclass(slots=True)
class FaultResult:
    scenario: str
    label: str
    node: str
    gpu: int | None
    slowdown: float
    cause: str
    detected: bool
    causes: list[str]  # causes of the matching events, first first
    frames_to_detect: float | None
    seconds_to_detect: float | None
    opens: int

    @property
    def cause_right(self) -> bool:
        return self.cause in self.causes

    @property
    def throttle(self) -> bool:
        name = self.label.split("/")[0]
        return THROTTLE_FIELD in FAULTS[name].shows_in and self.slowdown >= SLOW


@dataclass(slots=True)
class Score:
    locations: int = 0
    right_locations: int = 0
    false_opens: int = 0
    faults: list[FaultResult] = field(default_factory=list)
    healthy_events: int = 0  # events in healthy fleets (each one a false alarm)

    def add(self, other: Score) -> None:
        self.locations += other.locations
        self.right_locations += other.right_locations
        self.false_opens += other.false_opens
        self.faults.extend(other.faults)
        self.healthy_events += other.healthy_events

    @property
    def precision(self) -> float:
        return self.right_locations / self.locations if self.locations else 1.0

    def recall(self, *, slow_only: bool) -> float | None:
        pool = [f for f in self.faults if f.slowdown >= SLOW or not slow_only]
        return sum(f.detected for f in pool) / len(pool) if pool else None

    @property
    def cause_accuracy(self) -> float | None:
        found = [f for f in self.faults if f.detected]
        return sum(f.cause_right for f in found) / len(found) if found else None

    @property
    def churn(self) -> float | None:
        found = [f for f in self.faults if f.detected]
        return sum(f.opens for f in found) / len(found) if found else None

    def frames_to_detect(self) -> tuple[float | None, float | None]:
        return percentiles([f.frames_to_detect for f in self.faults if f.frames_to_detect is not None])

    def throttle_seconds(self) -> tuple[float | None, float | None, float | None, int]:
        """(p50, p90, worst, count) over throttle faults; worst is inf when one was missed."""
        pool = [f for f in self.faults if f.throttle]
        seen = [f.seconds_to_detect for f in pool if f.seconds_to_detect is not None]
        p50, p90 = percentiles(seen)
        worst = math.inf if len(seen) < len(pool) else (max(seen) if seen else None)
        return p50, p90, worst, len(pool)

    def as_dict(self) -> dict[str, Any]:
        p50, p90 = self.frames_to_detect()
        t50, t90, worst, count = self.throttle_seconds()
        return {
            "precision": _round(self.precision),
            "locations": self.locations,
            "false_locations": self.locations - self.right_locations,
            "false_opens": self.false_opens,
            "faults": len(self.faults),
            "recall_slow": _round(self.recall(slow_only=True)),
            "slow_faults": sum(f.slowdown >= SLOW for f in self.faults),
            "recall_all": _round(self.recall(slow_only=False)),
            "cause_accuracy": _round(self.cause_accuracy),
            "frames_to_detect_p50": p50,
            "frames_to_detect_p90": p90,
            "churn": _round(self.churn),
            "throttle_faults": count,
            "throttle_seconds_p50": t50,
            "throttle_seconds_p90": t90,
            "throttle_seconds_max": None if worst is None or math.isinf(worst) else worst,
            "throttle_missed": worst is not None and math.isinf(worst),
            "healthy_events": self.healthy_events,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def percentiles(values: Sequence[float]) -> tuple[float | None, float | None]:
    """(p50, p90), nearest-rank, of `values`; None when there are none."""
    if not values:
        return None, None
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]

    return statistics.median(ordered), rank(0.9)


def false_events(run: Run, events: Iterable[Event]) -> list[Event]:
    """The events that match no injection."""
    return [e for e in events if not any(matches(e, t.injection, run.scenario.seconds) for t in run.truths)]


def score(run: Run, events: Iterable[Event]) -> Score:
    """Score one run's events (a finding's opening, or a static flag) against its injections."""
    scenario = run.scenario
    events = sorted(events, key=lambda e: e.time)
    truths = run.truths
    out = Score()
    if scenario.kind == "healthy":
        out.healthy_events = len(events)
    first: dict[tuple[str, int | None], Event] = {}
    for event in events:
        first.setdefault((event.node, event.gpu), event)
    out.false_opens = len(false_events(run, events))
    out.locations = len(first)
    out.right_locations = sum(
        any(matches(e, t.injection, scenario.seconds) for t in truths) for e in first.values()
    )
    for truth in truths:
        inj = truth.injection
        mine = [e for e in events if matches(e, inj, scenario.seconds)]
        seconds = mine[0].time - inj.onset if mine else None
        out.faults.append(
            FaultResult(
                scenario=scenario.name,
                label=inj.label,
                node=inj.node,
                gpu=inj.gpu,
                slowdown=round(truth.slowdown, 4),
                cause=inj.cause,
                detected=bool(mine),
                causes=list(dict.fromkeys(e.cause for e in mine)),
                frames_to_detect=None if seconds is None else math.ceil(seconds / scenario.step),
                seconds_to_detect=seconds,
                opens=len(mine),
            )
        )
    return out
