"""Periodic probe scheduling, decided purely: fleet state and probe bookkeeping in, probe runs out.

The rules, each one a test in tests/controller/fleet/test_probe_schedule.py:

- Every GPU of a node, and the node as a whole (node-level probes: those whose ProbeInfo in the
  node's Hello says `node_level`, e.g. nccl), is due `interval` after it was last probed: its newest
  stored result or the last command that asked for it, whichever is later (a command that produced
  nothing is not retried at once). Never probed: due now.
- Each node's due time is shifted by a fixed offset within +-`jitter_ratio` of the interval, drawn
  from a hash of its name: a fleet probed at one moment (a restart, on-connect probes) drifts apart
  instead of probing in lockstep for ever, and the same node keeps the same slot across restarts.
- Only GPUs that telemetry shows idle are probed: a reading no older than `max_reading_age`, with
  utilisation at or below `idle_utilization` and no compute process. A missing or stale reading, or
  one without utilisation, is not idle: we do not know, so we do not disturb.
- A node whose GPUs are all idle, with anything due, gets a full run: every GPU, the configured
  probes (empty: the agent's default suite, node-level probes included). A node with only some GPUs
  idle gets a per-GPU run on its idle, due GPUs, without node-level probes: an all-reduce needs every
  GPU of the node, and would slow the job running on the busy ones.
- Only connected nodes that offer the "run_probes" capability, with no probe command in flight
  and not under maintenance (`skip`); of the configured probes, only those the node offers (none of
  them: the node is not probed).
- At most max(1, floor(max_fleet_share x connected nodes)) nodes probe at once, commands already in
  flight included; the most overdue go first (then by name, so decisions are reproducible).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from controller.config import ProbeConfig
from controller.fleet.derived import carried, keep, kept, probes_version
from controller.fleet.model import Fleet, NodeState, ProbeRecord
from controller.fleet.probe_info import node_level_probes, probe_infos

ProbeTarget = tuple[str, int | None]  # node, GPU index (None: the node as a whole)
LAST_PROBED = "last_probed"  # Fleet.derived: ((probe_version, len(probes)), target -> newest result)
CAPABILITY = "run_probes"


@dataclass(frozen=True, slots=True)
class ProbePlan:
    """One probe command to send: RunProbes{probes, gpus} to `node`."""

    node: str
    gpus: tuple[int, ...]  # empty: every GPU (a full run)
    probes: tuple[str, ...]  # empty: the agent's default suite
    overdue_seconds: float  # how long past due its most overdue target is (inf: never probed)
    why: str  # one line for the log


def jitter_offset(node: str, interval: float, jitter_ratio: float) -> float:
    """A fixed shift of `node`'s due times, within +-jitter_ratio x interval, from a hash of its name."""
    digest = hashlib.sha256(node.encode()).digest()
    fraction = int.from_bytes(digest[:8], "big") / 2**64  # uniform in [0, 1)
    return (2.0 * fraction - 1.0) * jitter_ratio * interval


def last_probed(fleet: Fleet, attempts: Mapping[ProbeTarget, float]) -> dict[ProbeTarget, float]:
    """When each target was last probed: its newest stored result or the last command asking for it.
    The results' part is worked out again only when a result (or a Hello saying otherwise of its
    node's GPUs or probes) came in since (Fleet.probe_version): a scheduling pass runs every few
    seconds over every stored result."""

    def build() -> dict[ProbeTarget, float]:
        results: dict[ProbeTarget, float] = {}
        for record in fleet.probes.values():
            key = (record.node, record.gpu)
            results[key] = max(results.get(key, record.time), record.time)
        return results

    last = dict(kept(fleet, LAST_PROBED, probes_version(fleet), build))
    for key, when in attempts.items():
        last[key] = max(last.get(key, when), when)
    return last


def probed(fleet: Fleet, before: tuple[int, int], records: Iterable[ProbeRecord]) -> None:
    """Keep last_probed's results current through new ones (apply_frame calls it with the fleet's
    (probe_version, len(probes)) from before it stored them), if they were current then: a result
    arriving somewhere in the fleet, every few seconds at 12,500 nodes, no longer has the next pass
    walk every stored result (0.2 s of the event loop at that size)."""
    results: dict[ProbeTarget, float] | None = carried(fleet, LAST_PROBED, before)
    if results is None:
        return
    for record in records:
        key = (record.node, record.gpu)
        results[key] = max(results.get(key, record.time), record.time)
    keep(fleet, LAST_PROBED, probes_version(fleet), results)


def idle_gpus(node: NodeState, now: float, idle_utilization: float, max_reading_age: float) -> list[int]:
    """GPUs of the node's inventory whose latest reading is fresh and shows them idle."""
    idle = []
    for info in node.hello.inventory.gpus:
        state = node.gpus.get(info.index)
        if state is None or now - state.time > max_reading_age:
            continue
        sample = state.sample
        if not sample.HasField("gpu_utilization_ratio") or sample.gpu_utilization_ratio > idle_utilization:
            continue
        if len(sample.processes) > 0:
            continue
        idle.append(info.index)
    return sorted(idle)


def fleet_slots(connected: int, share: float) -> int:
    """How many nodes may probe at once: a share of the connected ones, at least one."""
    return max(1, math.floor(share * connected))


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What planning reads of a node's Hello under one config, worked out once per Hello: a pass
    runs every few seconds over every connected node (at 12,500 nodes, most of its time went to
    parsing each Hello's probe list again)."""

    gpus: tuple[int, ...]  # the inventory's indices, sorted
    wanted: tuple[str, ...]  # the configured probes the node offers (empty: its default suite)
    per_gpu: tuple[str, ...]  # of those (or of all it offers), the ones not node-level
    node_level: bool  # the node as a whole is a target too
    shift: float  # jitter_offset of its due times
    none_wanted: bool  # probes are configured and it offers none of them: never probed


FactsEntry = tuple[object, ProbeConfig, NodeFacts]  # the Hello and config they were worked out from


def node_facts(node: NodeState, config: ProbeConfig) -> NodeFacts:
    gpus = tuple(sorted(info.index for info in node.hello.inventory.gpus))
    offered = list(probe_infos(node.hello))
    # Only what the node offers: the agent would refuse the whole run (and the node stay due, first
    # in line, every pass) for one probe it does not have.
    wanted = tuple(p for p in config.probes if p in offered)
    whole_node = node_level_probes(node.hello)  # probes that use every GPU of the node at once
    return NodeFacts(
        gpus=gpus,
        wanted=wanted,
        per_gpu=tuple(p for p in (wanted or offered) if p not in whole_node),
        node_level=any(p in whole_node for p in (wanted or offered)),
        shift=jitter_offset(node.name, config.interval_seconds, config.jitter_ratio),
        none_wanted=bool(config.probes) and not wanted,
    )


def plan_node(
    node: NodeState,
    last: Mapping[ProbeTarget, float],
    now: float,
    config: ProbeConfig,
    max_reading_age: float,
    *,
    facts: NodeFacts | None = None,
) -> ProbePlan | None:
    """The run `node` needs now, or None (nothing due, or nothing due is idle). `facts`: node_facts
    of its Hello and this config, when known."""
    facts = facts or node_facts(node, config)
    gpus = facts.gpus
    if not gpus or facts.none_wanted:
        return None
    name, shift, interval = node.name, facts.shift, config.interval_seconds

    def overdue(gpu: int | None) -> float:
        when = last.get((name, gpu))
        return math.inf if when is None else now - (when + interval + shift)

    due: dict[int | None, float] = {g: overdue(g) for g in gpus}
    if facts.node_level:
        due[None] = overdue(None)
    due = {g: late for g, late in due.items() if late >= 0}
    if not due:
        return None
    idle = idle_gpus(node, now, config.idle_utilization, max_reading_age)
    late = max(due.values())
    if len(idle) == len(gpus):
        return ProbePlan(name, (), facts.wanted, late, f"all {len(gpus)} GPUs idle")
    idle_due = tuple(g for g in idle if g in due)
    if not idle_due:
        return None
    if not facts.per_gpu:
        return None
    why = f"GPUs {','.join(map(str, idle_due))} idle of {len(gpus)}: per-GPU probes only"
    return ProbePlan(name, idle_due, facts.per_gpu, late, why)


def plan_probes(
    fleet: Fleet,
    *,
    in_flight: Collection[str],
    attempts: Mapping[ProbeTarget, float],
    now: float,
    config: ProbeConfig,
    max_reading_age: float,
    skip: Collection[str] = (),
) -> list[ProbePlan]:
    """The probe runs to start now, most overdue first, within the fleet's share of slots; the
    nodes in `skip` (under maintenance) are not probed."""
    connected = [n for n in fleet.nodes.values() if n.connected]
    slots = fleet_slots(len(connected), config.max_fleet_share) - len(in_flight)
    if slots <= 0:
        return []
    last = last_probed(fleet, attempts)
    plans = []
    # Each node's facts from the last pass, while its Hello and the config are the same objects
    kept: dict[str, FactsEntry] = fleet.derived.get("probe_facts", ({},))[0]  # type: ignore[assignment]
    facts: dict[str, FactsEntry] = {}
    for node in connected:
        if node.name in in_flight or node.name in skip or CAPABILITY not in node.hello.capabilities:
            continue
        entry = kept.get(node.name)
        if entry is None or entry[0] is not node.hello or entry[1] is not config:
            entry = (node.hello, config, node_facts(node, config))
        facts[node.name] = entry
        plan = plan_node(node, last, now, config, max_reading_age, facts=entry[2])
        if plan is not None:
            plans.append(plan)
    fleet.derived["probe_facts"] = (facts,)
    plans.sort(key=lambda p: (-p.overdue_seconds, p.node))
    return plans[:slots]
