"""Build controller fleet state from simulated nodes, through the real wire messages.

Agent side: SimNode readings -> agent.stream.frames (the same conversion the agent streams).
Controller side: plan_changes/write_of/apply_frame (the same updates ingest makes, without the store).
"""

from __future__ import annotations

from agent.snapshot import Snapshot
from agent.sources.sim import FaultSpec, SimNode
from agent.sources.sim.probes import ModelledProbes
from agent.stream import frames
from controller.fleet.model import Fleet
from controller.fleet.state import apply_frame, apply_hello, plan_changes, write_of
from controller.ingest import FleetMirror
from protos.gpufleet.v1 import telemetry_pb2 as pb


class SimFleet:
    def __init__(
        self,
        nodes: int,
        faults: dict[str, list[FaultSpec]] | None = None,
        seed: int = 1,
        start: float = 1_800_000_000.0,
    ) -> None:
        self.now = start
        self.fleet = Fleet()
        self.sims: dict[str, SimNode] = {}
        self.seq: dict[str, int] = {}
        for i in range(nodes):
            name = f"node-{i:02d}"
            sim = SimNode(name, faults=(faults or {}).get(name, []), seed=seed, clock=lambda: self.now)
            self.sims[name] = sim
            self.seq[name] = 0
            apply_hello(self.fleet, self.hello(name), 0, self.now)

    def hello(self, name: str) -> pb.Hello:
        sim = self.sims[name]
        return frames.hello(
            name, f"boot-{name}", "test", sim.inventory(), host=None, probes=["gemm"], started_at=self.now
        )

    def frame(self, name: str, *, probes: bool = False) -> pb.TelemetryFrame:
        sim = self.sims[name]
        snapshot = Snapshot(node=name, time=self.now, gpus=sim.read())
        if probes:
            snapshot.probes = ModelledProbes(sim).run([])
        self.seq[name] += 1
        return frames.frame(snapshot, f"boot-{name}", self.seq[name])

    def step(self, seconds: float = 1.0, *, probes: bool = False, mirror: FleetMirror | None = None) -> None:
        """Advance time and ingest one frame from every node; with `mirror` (a detection process or
        pool), each applied frame is also sent there, as Ingest does."""
        self.now += seconds
        for name in self.sims:
            frame = self.frame(name, probes=probes)
            plan = plan_changes(self.fleet.nodes[name], frame, self.now)
            apply_frame(self.fleet, write_of(name, frame, plan))
            if mirror is not None:
                mirror.frame(name, plan, frame.SerializeToString())
