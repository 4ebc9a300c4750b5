"""A fleet of 8-GPU nodes built in-process from the scale bench's frames (templates.py), as a
controller holds it after a few frames of each node: for the benches that time what a controller
does with a fleet of a given size on an idle machine (detection_passes.py, controller_views.py)."""

from __future__ import annotations

import time

from controller.fleet.model import Fleet
from controller.fleet.state import apply_frame, apply_hello, plan_frame
from controller_scale_load.templates import build_archetype, frame_message, hello_message
from protos.gpufleet.v1 import telemetry_pb2 as pb

ARCHETYPES = 8
FRAMES = 7  # per node: the first (with its probe round) and a BMC poll among the next


def build(nodes: int) -> tuple[Fleet, float]:
    """The fleet after FRAMES frames of every node, and the time of the last."""
    start = time.time() - 3600
    archetypes = [build_archetype(i, 1, start, 10.0) for i in range(ARCHETYPES)]
    fleet = Fleet()
    for n in range(nodes):
        archetype, name = archetypes[n % ARCHETYPES], f"node-{n:05d}"
        hello = pb.AgentMessage.FromString(hello_message(archetype, name, "boot", start)).hello
        apply_hello(fleet, hello, 0, start)
        for seq in range(1, FRAMES + 1):
            now = start + 10 * seq
            message = frame_message(archetype, name, "boot", seq=seq, floor=0, now=now)
            write, _ = plan_frame(fleet.nodes[name], pb.AgentMessage.FromString(message).frame, now + 1)
            apply_frame(fleet, write)
    return fleet, start + 10 * FRAMES + 1
