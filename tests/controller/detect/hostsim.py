"""A simulated fleet with hosts and BMCs, through the real wire messages (tests/simfleet.py feeds GPU
readings only).

Agent side: SimNode + SimHost + SimBmc readings -> agent.stream.frames, a frame every `step`, a BMC
poll every `bmc_every` seconds (carried by the next frame, as the agent's poller hands it over).
GPU readings are left out of the frames unless asked for (`gpu_readings`): the host and BMC
detectors never read them, and converting them is most of a frame's cost. SimHost and SimBmc draw
from streams of their own, so their readings are the same either way.
Controller side: plan_frame/apply_frame (the updates ingest makes, without the store), and the
registered detectors over the result.
"""

from __future__ import annotations

from collections.abc import Callable

from agent.snapshot import Snapshot
from agent.sources.bmc import BmcSample
from agent.sources.host import InfinibandPortReading
from agent.sources.sim import FaultSpec, SimHost, SimNode
from agent.sources.sim.bmc import SimBmc
from agent.stream import frames
from controller.config import DetectConfig
from controller.detect.base import DetectContext, discover
from controller.fleet.finding import Finding
from controller.fleet.model import Fleet
from controller.fleet.state import apply_frame, apply_hello, plan_frame
from protos.gpufleet.v1 import telemetry_pb2 as pb


class HostSimFleet:
    def __init__(
        self,
        nodes: int,
        faults: dict[str, list[FaultSpec]] | None = None,
        *,
        seed: int = 1,
        gpus: int = 8,
        start: float = 1_800_000_000.0,
        bmc_every: float = 60.0,
        gpu_readings: bool = False,
    ) -> None:
        self.now = start
        self.gpu_readings = gpu_readings
        self.bmc_every = bmc_every
        self.fleet = Fleet()
        self.sims: dict[str, tuple[SimNode, SimHost, SimBmc]] = {}
        self.seq: dict[str, int] = {}
        self.last_poll: dict[str, float] = {}
        # A test may change a node's BMC samples (a failed poll, a sensor without thresholds) until
        # it removes the entry: name -> what the poll's sample becomes.
        self.poll_override: dict[str, Callable[[BmcSample], BmcSample]] = {}
        for i in range(nodes):
            self.add(f"node-{i:02d}", (faults or {}).get(f"node-{i:02d}", []), seed=seed, gpus=gpus)

    def clock(self) -> float:
        return self.now

    def add(self, name: str, faults: list[FaultSpec], *, seed: int = 1, gpus: int = 8) -> None:
        """A node (or a node rebuilt: the same name and seed with other faults, as after a repair)."""
        node = SimNode(name, gpus=gpus, faults=faults, seed=seed, clock=self.clock)
        self.sims[name] = (node, SimHost(node, seed=seed), SimBmc(node, seed=seed))
        self.seq.setdefault(name, 0)
        self.last_poll.pop(name, None)
        hello = frames.hello(
            name, f"boot-{name}", "test", node.inventory(), host=None, probes=["gemm"], started_at=self.now
        )
        apply_hello(self.fleet, hello, self.seq[name], self.now)

    def step(self, seconds: float = 10.0) -> None:
        """Advance time and ingest one frame from every node."""
        self.now += seconds
        for name, (node, host, bmc) in self.sims.items():
            gpu_readings = node.read() if self.gpu_readings else []
            snapshot = Snapshot(node=name, time=self.now, gpus=gpu_readings, host=host.read())
            if self.now - self.last_poll.get(name, -1e18) >= self.bmc_every:
                self.last_poll[name] = self.now
                sample = bmc.poll()
                override = self.poll_override.get(name)
                snapshot.bmc, snapshot.bmc_new = (override(sample) if override else sample), True
            self.seq[name] += 1
            frame = frames.frame(snapshot, f"boot-{name}", self.seq[name])
            write, _ = plan_frame(self.fleet.nodes[name], frame, self.now)
            apply_frame(self.fleet, write)

    def run(self, seconds: float, step: float = 10.0) -> None:
        end = self.now + seconds
        while self.now + step <= end + 1e-9:
            self.step(step)

    def detect(self, detector: str, config: DetectConfig | None = None) -> list[Finding]:
        ctx = DetectContext(self.fleet, config or DetectConfig(), self.now)
        return discover()[detector](ctx)


def digested(host: pb.HostSample) -> pb.HostSample:
    """`host` with the ports' digest its agent would send for its ports as they now are
    (HostSample.infiniband_digest, agent/stream/frames.py): for a test that edits a copy of a
    node's host sample into its next reading."""
    ports = [
        InfinibandPortReading(
            p.device,
            p.port,
            p.link_layer,
            p.state,
            p.physical_state,
            p.rate_gbps if p.HasField("rate_gbps") else None,
            p.link_downed_total if p.HasField("link_downed_total") else None,
            p.symbol_error_total if p.HasField("symbol_error_total") else None,
            p.port_rcv_errors_total if p.HasField("port_rcv_errors_total") else None,
            p.link_error_recovery_total if p.HasField("link_error_recovery_total") else None,
        )
        for p in host.infiniband
    ]
    if ports:
        host.infiniband_digest = frames.infiniband_digest(ports)
    else:
        host.ClearField("infiniband_digest")
    return host
