"""Run one scenario: simulated agents -> wire messages -> the controller's offline detection.

Each node is what an agent would stream: a Hello (inventory, host facts, the probes it offers),
then a frame every `step` seconds with the GPU and host readings, the BMC's poll every 60 s (the
agent's default) and, on a probe round, the modelled probe results. Probe rounds follow the
controller's scheduler: one at connect, then every probe interval shifted by the node's fixed
jitter; unlike it, the bench does not wait for idle GPUs (the simulator models a probe on an idle
GPU anyway). Faults are applied to the simulator's objects at their onset and reset to the healthy
condition at their end.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from agent.probes.base import ProbeOutcome
from agent.snapshot import CollectorStatus, Snapshot
from agent.sources.bmc import BmcSample
from agent.sources.sim import SimHost, SimNode
from agent.sources.sim.bmc import BmcCondition, SimBmc
from agent.sources.sim.faults import FAULTS
from agent.sources.sim.gpu import GpuCondition
from agent.sources.sim.host import HostCondition
from agent.sources.sim.probes import ModelledProbes
from agent.sources.sim.profile import XID_CONTAINED_ECC, XID_ROW_REMAP_EVENT
from agent.stream import frames
from controller.config import DetectConfig
from controller.detect.offline import OfflineDetector
from controller.fleet.findings import StoredFinding
from controller.fleet.probe_schedule import jitter_offset
from detection_scenarios.scenarios import MODELS, Injection, Scenario
from detection_scenarios.severity import set_severity, slowdown
from protos.gpufleet.v1 import telemetry_pb2 as pb

START = 1_800_000_000.0  # a fixed wall-clock start: the diurnal inlet swing is the same every run
BMC_INTERVAL = 60.0
JITTER_RATIO = 0.1  # the controller's default probes.jitter_ratio
IDLE_EVERY, IDLE_FOR = 6 * 3600.0, 45 * 60.0


@dataclass(frozen=True, slots=True)
class Event:
    """A finding opened or resolved (or, for the static rule, a location flagged)."""

    time: float  # seconds after the run started
    node: str
    gpu: int | None
    cause: str
    severity: str = ""


@dataclass(frozen=True, slots=True)
class ProbeValue:
    time: float
    node: str
    gpu: int | None
    model: str
    probe: str
    variant: str
    value: float  # 0.0 for a run that failed


@dataclass(frozen=True, slots=True)
class Truth:
    injection: Injection
    slowdown: float  # the largest probe-figure drop the GPU model gives at onset (0: no speed effect)


@dataclass(slots=True)
class Run:
    scenario: Scenario
    truths: list[Truth] = field(default_factory=list)
    opens: list[Event] = field(default_factory=list)
    resolves: list[Event] = field(default_factory=list)
    open_at_end: list[Event] = field(default_factory=list)
    probes: list[ProbeValue] = field(default_factory=list)
    frames: int = 0
    passes: int = 0
    wall_seconds: float = 0.0


class Agent:
    """One simulated node as its agent streams it."""

    def __init__(self, scenario: Scenario, index: int, clock: list[float]) -> None:
        self.name = scenario.nodes[index]
        self.model = scenario.models[index]
        idle = index < scenario.idle_nodes
        self.sim = SimNode(
            self.name,
            gpus=scenario.gpus,
            seed=scenario.seed,
            profile=MODELS[self.model],
            clock=lambda: clock[0],
            idle_every_seconds=IDLE_EVERY if idle else None,
            idle_seconds=IDLE_FOR if idle else 0.0,
        )
        self.host = SimHost(self.sim, seed=scenario.seed)
        self.bmc = SimBmc(self.sim, seed=scenario.seed)
        self.probes = ModelledProbes(self.sim)
        self.boot = f"boot-{self.name}"
        self.seq = 0
        self.next_probe = clock[0]  # on connect
        self.next_bmc = clock[0]
        self.shift = jitter_offset(self.name, scenario.probe_interval, JITTER_RATIO)
        self.interval = scenario.probe_interval
        self.bmc_sample: BmcSample | None = None

    def hello(self, now: float) -> pb.Hello:
        return frames.hello(
            self.name,
            self.boot,
            "bench",
            self.sim.inventory(),
            host=self.host.facts(),
            probes=self.probes.available(),
            started_at=now,
        )

    def frame(self, now: float) -> tuple[pb.TelemetryFrame, list[ProbeOutcome]]:
        snapshot = Snapshot(node=self.name, time=now, gpus=self.sim.read(), host=self.host.read())
        errors = self.sim.last_errors()
        snapshot.collectors["gpu"] = CollectorStatus("gpu", not errors, 0.0, "; ".join(errors))
        snapshot.collectors["host"] = CollectorStatus("host", True, 0.0)
        if now >= self.next_bmc:
            self.bmc_sample, snapshot.bmc_new = self.bmc.poll(), True
            self.next_bmc = now + BMC_INTERVAL
        snapshot.bmc = self.bmc_sample
        snapshot.collectors["bmc"] = CollectorStatus("bmc", True, 0.0)
        if now >= self.next_probe:
            snapshot.probes = self.probes.run([])
            self.next_probe = now + self.interval + self.shift
        self.seq += 1
        return frames.frame(snapshot, self.boot, self.seq), snapshot.probes

    def inject(self, injection: Injection, rng: random.Random) -> float:
        """Apply the fault now; return the slowdown it causes (GPU faults; 0 elsewhere)."""
        fault = FAULTS[injection.fault]
        if fault.level in ("host", "network"):
            fault.apply(self.host, None, rng)
            return 0.0
        if fault.level == "bmc":
            fault.apply(self.bmc, None, rng)
            return 0.0
        assert injection.gpu is not None
        gpu = self.sim.gpus[injection.gpu]
        xids, pending = len(gpu.condition.xids), gpu.condition.row_remap_pending
        fault.apply(gpu, None, rng)
        now = self.sim.clock()
        set_severity(injection.fault, injection.severity, gpu, self.sim.inlet_celsius(now), rng)
        # The simulator raises a fault's XIDs only for faults present when the node starts: raise
        # those of a fault that starts later here, as GpuCounters.start would have.
        codes = list(gpu.condition.xids[xids:])
        if gpu.condition.row_remap_pending and not pending:
            codes = [XID_CONTAINED_ECC, XID_ROW_REMAP_EVENT] * gpu.condition.extra_uncorrectable + codes
        self.sim._counters[injection.gpu].xid_pending += codes  # no public way yet
        return slowdown(gpu, self.sim.inlet_celsius(now))

    def clear(self, injection: Injection) -> None:
        """End the fault: what it hit goes back to its healthy condition."""
        level = FAULTS[injection.fault].level
        if level in ("host", "network"):
            self.host.condition = HostCondition()
        elif level == "bmc":
            self.bmc.condition = BmcCondition()
        else:
            assert injection.gpu is not None
            self.sim.gpus[injection.gpu].condition = GpuCondition()


def _event(time_: float, stored: StoredFinding) -> Event:
    finding = stored.finding
    return Event(time_, finding.node, finding.gpu, finding.cause, finding.severity)


def run(scenario: Scenario) -> Run:
    """Drive `scenario` from the first Hello to its end; every finding opened and resolved."""
    began = time.perf_counter()
    clock = [START]
    detector = OfflineDetector(DetectConfig(interval_seconds=scenario.detect_interval))
    agents = {name: Agent(scenario, i, clock) for i, name in enumerate(scenario.nodes)}
    result = Run(scenario)
    pending = sorted(scenario.injections, key=lambda i: i.onset)
    ending = sorted((i for i in scenario.injections if i.end is not None), key=lambda i: i.end or 0.0)
    rng = random.Random(f"{scenario.seed}:{scenario.name}:inject")
    # Faults present at connect act before the Hello (vbios drift shows in its inventory).
    while pending and pending[0].onset <= 0.0:
        injection = pending.pop(0)
        result.truths.append(Truth(injection, agents[injection.node].inject(injection, rng)))
    for agent in agents.values():
        detector.hello(agent.hello(START), START)
    steps = int(scenario.seconds // scenario.step)
    for k in range(1, steps + 1):
        clock[0] = now = START + k * scenario.step
        elapsed = now - START
        while pending and pending[0].onset <= elapsed:
            injection = pending.pop(0)
            result.truths.append(Truth(injection, agents[injection.node].inject(injection, rng)))
        while ending and (ending[0].end or 0.0) <= elapsed:
            injection = ending.pop(0)
            agents[injection.node].clear(injection)
        for agent in agents.values():
            frame, outcomes = agent.frame(now)
            result.probes.extend(
                ProbeValue(
                    elapsed, agent.name, o.gpu, agent.model, o.probe, o.variant, 0.0 if o.error else o.value
                )
                for o in outcomes
            )
            detector.frame(frame, now)
            result.frames += 1
    detector.finish()
    for p in detector.passes:
        result.opens.extend(_event(p.time - START, s) for s in p.opened)
        result.resolves.extend(_event(p.time - START, s) for s in p.resolved)
    result.open_at_end = [_event(s.first_seen - START, s) for s in detector.active.values()]
    result.passes = len(detector.passes)
    result.wall_seconds = time.perf_counter() - began
    return result
