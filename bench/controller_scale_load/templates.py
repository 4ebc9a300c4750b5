"""Frames as the agent sends them, built cheaply enough that the load generator is not the bottleneck.

A handful of archetype nodes are simulated once (8-GPU H100s: GPU, host and BMC readings, one round
of modelled probe results). Each simulated node borrows one archetype: its Hello, its first frame
(with the probe round, as the agent's first frame after its on-connect round) and then a cycle of
`CYCLE` frames 10 s apart (the BMC poll in the cycle's first, as at the agent's 60 s BMC interval).

A frame goes out as pre-serialised bytes: the archetype's body (everything but the node, boot, seq,
floor and time) followed by a small serialised header carrying those. Protobuf merges a message
that arrives in parts (a later scalar wins, a later submessage merges), so the controller parses
exactly the frame the agent would have sent. When the cycle wraps, cumulative counters go back to
the cycle's start; the controller treats that as a counter reset (controller/fleet/trends.py).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from google.protobuf.timestamp_pb2 import Timestamp

from agent.snapshot import CollectorStatus, Snapshot
from agent.sources.sim import SimHost, SimNode
from agent.sources.sim.bmc import SimBmc
from agent.sources.sim.probes import ModelledProbes
from agent.stream import frames
from protos.gpufleet.v1 import telemetry_pb2 as pb

CYCLE = 6  # frames per archetype before its readings repeat (one BMC poll each cycle)
FRAME_TAG = b"\x12"  # AgentMessage.frame: field 2, length-delimited
SIM_CPUS = 32  # logical CPUs of a simulated host (the simulator's default; a DGX H100 has 224)


@dataclass(frozen=True)
class Archetype:
    """One simulated node's messages, with the per-node fields left for the header."""

    hello: pb.Hello  # node, boot_id and started_at are set per node
    first: bytes  # the first frame's body: readings and a probe round
    cycle: tuple[bytes, ...]  # the later frames' bodies, in order
    bmc: tuple[bool, ...]  # whether cycle[i] carries a BMC sample (its time is renewed per frame)
    first_has_bmc: bool


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def timestamp(unix_seconds: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(unix_seconds * 1e9))
    return ts


def _body(frame: pb.TelemetryFrame) -> bytes:
    for name in ("node", "boot_id", "seq", "spool_floor_seq", "time"):
        frame.ClearField(name)
    return frame.SerializeToString()


def add_older_agent_options(parser: argparse.ArgumentParser) -> None:
    """--per-cpu and --per-link: frames as older agents sent them (build_archetype's per_cpu, per_link)."""
    parser.add_argument(
        "--per-cpu",
        action="store_true",
        help="frames with each CPU's reading, as agents before HostSample.cpu_governors sent them",
    )
    parser.add_argument(
        "--per-link",
        action="store_true",
        help="frames with each NVLink's traffic and peer bus id, as agents before this sent them",
    )


def build_archetype(
    index: int,
    seed: int,
    start: float,
    interval: float,
    cpus: int = SIM_CPUS,
    *,
    per_cpu: bool = False,
    per_link: bool = False,
) -> Archetype:
    """Simulate archetype `index` from `start` on: its Hello, a first frame and CYCLE more; its host
    has `cpus` logical CPUs, counted per governor in every frame (HostSample.cpu_governors), or with
    `per_cpu` each with its own reading instead, as agents before cpu_governors sent them. With
    `per_link` each NVLink carries its traffic and peer too, as agents before this sent them."""
    now = [start]
    name = f"archetype-{seed}-{index}"
    sim = SimNode(name, seed=seed * 1009 + index, clock=lambda: now[0])
    host = SimHost(sim, seed=seed, cpus=cpus)
    bmc = SimBmc(sim, seed=seed)
    hello = frames.hello(
        name, "boot", "bench", sim.inventory(), host=host.facts(), probes=[], started_at=start
    )
    bodies: list[bytes] = []
    has_bmc: list[bool] = []
    for k in range(CYCLE + 1):
        now[0] = start + k * interval
        snapshot = Snapshot(node=name, time=now[0], gpus=sim.read(), host=host.read())
        snapshot.collectors["gpu"] = CollectorStatus("gpu", True, 0.0)
        snapshot.collectors["host"] = CollectorStatus("host", True, 0.0)
        snapshot.collectors["bmc"] = CollectorStatus("bmc", True, 0.0)
        if k <= 1:  # the first frame and the cycle's first carry a poll
            snapshot.bmc, snapshot.bmc_new = bmc.poll(), True
        if k == 0:
            snapshot.probes = ModelledProbes(sim).run([])
        frame = frames.frame(snapshot, "boot", k + 1)
        if per_link:
            for wire, reading in zip(frame.gpus, snapshot.gpus, strict=True):
                del wire.nvlinks[:]
                for link in reading.nvlinks:
                    frames.fill(wire.nvlinks.add(), link)
        if per_cpu:
            frame.host.ClearField("cpu_governors")
            for cpu in snapshot.host.cpus if snapshot.host is not None else ():
                frames.fill(frame.host.cpus.add(), cpu)
        bodies.append(_body(frame))
        has_bmc.append(k <= 1)
    return Archetype(hello, bodies[0], tuple(bodies[1:]), tuple(has_bmc[1:]), has_bmc[0])


def hello_message(archetype: Archetype, node: str, boot_id: str, started_at: float) -> bytes:
    """The serialised AgentMessage carrying `node`'s Hello."""
    hello = pb.Hello()
    hello.CopyFrom(archetype.hello)
    hello.node, hello.boot_id = node, boot_id
    hello.started_at.CopyFrom(timestamp(started_at))
    return pb.AgentMessage(hello=hello).SerializeToString()


def frame_message(
    archetype: Archetype, node: str, boot_id: str, *, seq: int, floor: int, now: float
) -> bytes:
    """The serialised AgentMessage carrying frame `seq` of `node`, stamped `now` (seq 1: the first
    frame of the boot, with the probe round)."""
    if seq == 1:
        body, bmc = archetype.first, archetype.first_has_bmc
    else:
        slot = (seq - 2) % CYCLE
        body, bmc = archetype.cycle[slot], archetype.bmc[slot]
    stamp = timestamp(now)
    header = pb.TelemetryFrame(node=node, boot_id=boot_id, seq=seq, spool_floor_seq=floor, time=stamp)
    if bmc:
        header.bmc.time.CopyFrom(stamp)
    frame = body + header.SerializeToString()
    return FRAME_TAG + _varint(len(frame)) + frame
