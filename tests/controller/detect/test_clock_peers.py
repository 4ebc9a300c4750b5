"""Busy GPUs' clocks by peer key (controller/detect/clock_peers.py): read once per reading and kept,
and each GPU's peers' median the one of every other busy GPU of its key, one by one."""

from __future__ import annotations

import random
import statistics

import pytest

from controller.config import DetectConfig
from controller.detect import clock_lock, clock_peers
from controller.detect.base import DetectContext, discover
from controller.fleet.model import NodeState
from controller.fleet.state import apply_hello
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.detect.test_clock_lock import step
from tests.simfleet import SimFleet

MAX = 1980e6


def scatter(seed: int) -> tuple[SimFleet, float]:
    """Six nodes whose GPUs run at drawn clocks, utilisations, max clocks and power limits."""
    sim, draw = SimFleet(6), random.Random(seed)

    def change(_: str, s: pb.GpuSample) -> None:
        s.max_sm_clock_hz = draw.choice([MAX, 1755e6])
        s.default_power_limit_watts = draw.choice([700.0, 700.0, 400.0])
        s.sm_clock_hz = draw.choice([MAX, 1900e6, 1400e6, 1755e6])
        s.gpu_utilization_ratio = draw.choice([0.95, 0.95, 0.5, 0.9])
        if draw.random() < 0.1:
            s.ClearField("sm_clock_hz")

    step(sim, change)
    return sim, 0.9


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_each_gpus_peers_median_is_the_median_of_every_other_busy_gpu_of_its_key(seed: int) -> None:
    sim, floor = scatter(seed)
    busy = clock_peers.busy_clocks(sim.fleet, floor)
    gpus = [(node, gpu) for node in sim.fleet.nodes.values() for gpu in node.gpus.values()]

    def key(node: NodeState, index: int) -> clock_peers.PeerKey:
        return clock_peers.peer_key(node.gpu_names(), node.gpus[index])

    checked = 0
    for node, gpu in gpus:
        others = [
            g.sample.sm_clock_hz
            for n, g in gpus
            if (n.name, g.index) != (node.name, gpu.index)
            and key(n, g.index) == key(node, gpu.index)
            and g.sample.HasField("sm_clock_hz")
            and g.sample.gpu_utilization_ratio >= floor
        ]
        expected = (statistics.median(others) if others else None, len(others))
        assert clock_peers.peers_median(busy, key(node, gpu.index), gpu, floor) == expected
        checked += len(others) > 1
    assert checked > 20


def test_a_nodes_gpus_are_read_again_only_after_a_new_reading_or_hello_and_a_forgotten_node_is_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim, floor = scatter(1)
    clock_peers.busy_clocks(sim.fleet, floor)
    read: list[str] = []
    real = clock_peers._read

    def counted(node: NodeState, utilization: float) -> clock_peers.NodeBusy:
        read.append(node.name)
        return real(node, utilization)

    monkeypatch.setattr(clock_peers, "_read", counted)
    before = clock_peers.busy_clocks(sim.fleet, floor)
    assert read == []
    node = sim.fleet.nodes["node-03"]
    gpu = node.gpus[2]
    node.gpus[2] = type(gpu)(gpu.index, pb.GpuSample(), gpu.time, {})  # a reading without a clock
    after = clock_peers.busy_clocks(sim.fleet, floor)
    assert read == ["node-03"]
    was_busy = clock_peers.busy_clock(gpu, floor) is not None
    assert sum(map(len, after.values())) == sum(map(len, before.values())) - was_busy
    apply_hello(sim.fleet, sim.hello("node-04"), 0, sim.now)  # a new Hello: GPU names may differ
    clock_peers.busy_clocks(sim.fleet, floor)
    assert read == ["node-03", "node-04"]
    clock_peers.busy_clocks(sim.fleet, 0.5)  # another floor: every node again
    assert read[2:] == sorted(sim.fleet.nodes)
    del sim.fleet.nodes["node-01"]
    clock_peers.busy_clocks(sim.fleet, 0.5)
    assert "node-01" not in sim.fleet.derived[clock_peers.KEPT][1]  # type: ignore[operator]


def test_no_gpu_holding_a_low_clock_reads_no_peers(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = SimFleet(4)
    sim.step(10.0)
    sim.step(10.0)

    def refuse(*_: object) -> object:
        raise AssertionError("peers read with no GPU to compare")

    monkeypatch.setattr(clock_lock, "busy_clocks", refuse)
    assert discover()["clock_lock"](DetectContext(sim.fleet, DetectConfig(), sim.now)) == []
