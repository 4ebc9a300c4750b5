"""A SuperBench-style static rule on the same probe results: flag a result more than 5% worse than
a fixed baseline, the per-model median of each probe/variant from a healthy run (what a baseline
file holds). A failed run reads 0.0, so it is flagged too. A location (node, GPU; NCCL: the node)
is flagged by a probe round with any flagged result, and stays flagged until a round without one:
an event is its flagging after a clean round (or its first)."""

from __future__ import annotations

import statistics
from collections import defaultdict

from agent.probes.kernels import infos
from agent.sources.sim import SimNode
from agent.sources.sim.probes import ModelledProbes
from detection_scenarios.drive import START, Event, ProbeValue
from detection_scenarios.scenarios import MODELS, node_name

MARGIN = 0.05
CAUSE = "static_rule"
Baseline = dict[tuple[str, str, str], float]  # (model, probe, variant) -> median


def healthy_baseline(seed: int, nodes: int = 8) -> Baseline:
    """Per-model medians of one probe round on a healthy fleet of `nodes` nodes per model (its own
    seed: the fleets it judges are other machines)."""
    values: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for model, profile in MODELS.items():
        for i in range(nodes):
            sim = SimNode(f"baseline-{node_name(i)}", seed=seed, profile=profile, clock=lambda: START)
            for outcome in ModelledProbes(sim).run([]):
                if not outcome.error:
                    values[(model, outcome.probe, outcome.variant)].append(outcome.value)
    return {key: statistics.median(v) for key, v in values.items()}


def _higher_is_better() -> dict[str, bool]:
    return {i.name: i.higher_is_better for i in infos()}


def flagged(value: ProbeValue, baseline: Baseline, higher: dict[str, bool]) -> bool:
    base = baseline.get((value.model, value.probe, value.variant))
    if base is None:
        return False
    if higher.get(value.probe, True):
        return value.value < (1.0 - MARGIN) * base
    return value.value > (1.0 + MARGIN) * base


def events(probes: list[ProbeValue], baseline: Baseline) -> list[Event]:
    higher = _higher_is_better()
    rounds: dict[tuple[str, int | None], dict[float, bool]] = defaultdict(dict)
    for value in probes:
        where = rounds[(value.node, value.gpu)]
        where[value.time] = where.get(value.time, False) or flagged(value, baseline, higher)
    out = []
    for (node, gpu), by_time in rounds.items():
        was = False
        for when in sorted(by_time):
            now = by_time[when]
            if now and not was:
                out.append(Event(when, node, gpu, CAUSE))
            was = now
    return sorted(out, key=lambda e: e.time)
