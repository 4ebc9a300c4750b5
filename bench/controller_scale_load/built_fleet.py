"""A fleet of 8-GPU nodes built in-process from the scale bench's frames (templates.py), as a
controller holds it after a few frames of each node: for the benches that time what a controller
does with a fleet of a given size on an idle machine (detection_passes.py, controller_views.py).
`BuiltFleet.next_frames` gives every node its next frame, as each agent's 10 s cadence brings one
between two detection passes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from controller.fleet.model import Fleet
from controller.fleet.state import apply_frame, apply_hello, plan_frame
from controller_scale_load.templates import Archetype, build_archetype, frame_message, hello_message
from protos.gpufleet.v1 import telemetry_pb2 as pb

ARCHETYPES = 8
FRAMES = 7  # per node: the first (with its probe round) and a BMC poll among the next
INTERVAL = 10.0


@dataclass
class BuiltFleet:
    fleet: Fleet
    archetypes: list[Archetype]
    start: float  # the time of the nodes' Hellos
    seq: int = FRAMES  # the frames each node has sent

    @property
    def now(self) -> float:
        """Just after the nodes' newest frame."""
        return self.start + INTERVAL * self.seq + 1

    def next_frames(self) -> Iterator[tuple[str, pb.TelemetryFrame]]:
        """Each node's next frame (node name, frame), not applied: the caller plans and applies it."""
        self.seq += 1
        at = self.start + INTERVAL * self.seq
        for n, name in enumerate(self.fleet.nodes):
            message = frame_message(
                self.archetypes[n % ARCHETYPES], name, "boot", seq=self.seq, floor=0, now=at
            )
            yield name, pb.AgentMessage.FromString(message).frame


def build_fleet(nodes: int) -> BuiltFleet:
    """The fleet after FRAMES frames of every node."""
    start = time.time() - 3600
    archetypes = [build_archetype(i, 1, start, INTERVAL) for i in range(ARCHETYPES)]
    built = BuiltFleet(Fleet(), archetypes, start, 0)
    for n in range(nodes):
        name = f"node-{n:05d}"
        hello = pb.AgentMessage.FromString(
            hello_message(archetypes[n % ARCHETYPES], name, "boot", start)
        ).hello
        apply_hello(built.fleet, hello, 0, start)
    for _ in range(FRAMES):
        for name, frame in built.next_frames():
            write, _ = plan_frame(built.fleet.nodes[name], frame, built.now)
            apply_frame(built.fleet, write)
    return built


def build(nodes: int) -> tuple[Fleet, float]:
    """The fleet after FRAMES frames of every node, and the time of the last."""
    built = build_fleet(nodes)
    return built.fleet, built.now
