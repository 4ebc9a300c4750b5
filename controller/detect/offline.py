"""Detection without a controller process: the same state updates and detectors over messages fed
in time order (a recording, a simulated fleet). `gpufleet analyze` and bench/detection.py use it.

Feed Hellos and frames with the time the controller received them; `run_until(t)` runs a detection
pass at every `interval_seconds` step up to t, as the controller's loop would, so findings open and
resolve at the times they would have.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from controller.config import DetectConfig
from controller.detect.base import DetectContext, discover
from controller.detect.runner import run_detectors
from controller.fleet.finding import FindingKey
from controller.fleet.findings import FindingTracker, StoredFinding
from controller.fleet.model import Fleet
from controller.fleet.state import apply_frame, apply_hello, plan_frame
from protos.gpufleet.v1 import telemetry_pb2 as pb


@dataclass(slots=True)
class PassResult:
    time: float
    opened: list[StoredFinding]
    resolved: list[StoredFinding]


@dataclass(slots=True)
class OfflineDetector:
    config: DetectConfig = field(default_factory=DetectConfig)
    fleet: Fleet = field(default_factory=Fleet)
    active: dict[FindingKey, StoredFinding] = field(default_factory=dict)
    findings: dict[str, StoredFinding] = field(default_factory=dict)  # every finding by id, newest state
    passes: list[PassResult] = field(default_factory=list)
    skipped: int = 0  # frames of nodes never announced by a Hello (no inventory to read them with)
    next_pass: float | None = None
    detectors: list[str] = field(default_factory=list)
    tracker: FindingTracker = field(init=False)  # the controller's hysteresis, from config

    def __post_init__(self) -> None:
        self.tracker = FindingTracker.for_config(self.config)
        if not self.detectors:
            self.detectors = self.config.enabled(sorted(discover()))

    def hello(self, hello: pb.Hello, received: float) -> None:
        self.run_until(received)
        node = apply_hello(self.fleet, hello, 0, received)
        node.connected = True

    def frame(self, frame: pb.TelemetryFrame, received: float) -> None:
        self.run_until(received)
        node = self.fleet.nodes.get(frame.node)
        if node is None:
            self.skipped += 1
            return
        write, _ = plan_frame(node, frame, received)
        apply_frame(self.fleet, write)

    def message(self, message: pb.AgentMessage, received: float) -> None:
        kind = message.WhichOneof("msg")
        if kind == "hello":
            self.hello(message.hello, received)
        elif kind == "frame":
            self.frame(message.frame, received)

    def feed(self, messages: Iterable[tuple[float, pb.AgentMessage]]) -> None:
        for received, message in messages:
            self.message(message, received)

    def run_until(self, now: float) -> None:
        """Run every detection pass due up to `now` (the first one interval_seconds after the
        first message)."""
        if self.next_pass is None:
            self.next_pass = now + self.config.interval_seconds
            return
        while self.next_pass <= now:
            self.detect(self.next_pass)
            self.next_pass += self.config.interval_seconds

    def detect(self, now: float) -> PassResult:
        report = run_detectors(DetectContext(self.fleet, self.config, now), self.detectors)
        upserts, resolved = self.tracker.reconcile(self.active, report.findings, now)
        opened = [s for s in upserts if s.finding.key not in self.active]
        for stored in upserts:
            self.active[stored.finding.key] = stored
            self.findings[stored.id] = stored
        for stored in resolved:
            del self.active[stored.finding.key]
            self.findings[stored.id] = stored
        result = PassResult(now, opened, resolved)
        self.passes.append(result)
        return result

    def finish(self) -> None:
        """One last pass at the time of the next due pass, so the newest messages are judged."""
        if self.next_pass is not None:
            self.detect(self.next_pass)
