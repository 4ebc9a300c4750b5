"""Hot intakes (controller/detect/bmc_health.py): each BMC sample's intakes are read once, and only a
sensor without thresholds hot enough to matter is judged against its group's median each pass; the
findings must be those of judging every node's every intake against the median, one by one."""

from __future__ import annotations

import random
import statistics

import pytest

from controller.config import DetectConfig
from controller.detect.bmc_health import inlet_finding, intakes
from controller.fleet.model import NodeState
from protos.gpufleet.v1 import bmc_pb2
from tests.controller.detect.hostsim import HostSimFleet


def drawn_sample(draw: random.Random) -> bmc_pb2.BmcSample:
    sample = bmc_pb2.BmcSample(success=True)
    for i in range(draw.choice([1, 1, 2, 3])):
        t = sample.temperatures.add(name=f"Inlet {i}", context="intake", state="enabled")
        t.reading_celsius = draw.choice([22.0, 25.0, 27.0, 30.0, 32.0, 33.0, 35.0, 38.0, 44.0, 52.0])
        if draw.random() < 0.4:
            t.upper_caution_celsius = draw.choice([35.0, 42.0])
        if draw.random() < 0.3:
            t.upper_critical_celsius = 50.0
    sample.temperatures.add(name="Exhaust", context="exhaust", reading_celsius=60.0, state="enabled")
    return sample


def one_by_one(nodes: list[NodeState], config: DetectConfig) -> list[tuple[str, str, str]]:
    hottest = [max(t.reading_celsius for t in intakes(n.bmc)) for n in nodes if n.bmc and intakes(n.bmc)]
    median = statistics.median(hottest) if len(hottest) >= config.min_peers else None
    out = []
    for node in nodes:
        assert node.bmc is not None
        f = inlet_finding(node, node.bmc, median, len(hottest), config.inlet_margin_celsius)
        if f is not None:
            out.append((f.node, f.severity, f.summary))
    return out


@pytest.mark.parametrize("seed", range(1, 7))
def test_intakes_judged_once_per_sample_read_as_every_intake_judged_each_pass(seed: int) -> None:
    fleet = HostSimFleet(12)
    fleet.run(10)
    draw = random.Random(seed)
    nodes = list(fleet.fleet.nodes.values())
    for node in nodes:
        node.bmc, node.bmc_time = drawn_sample(draw), node.last_seen
    margin = draw.choice([5.0, 8.0])
    if seed % 2:  # a sensor without thresholds exactly the margin above the median
        hottest = statistics.median(max(t.reading_celsius for t in intakes(n.bmc)) for n in nodes if n.bmc)
        top = max(nodes, key=lambda n: max(t.reading_celsius for t in intakes(n.bmc)))  # type: ignore[arg-type]
        intake = top.bmc.temperatures[0]  # type: ignore[union-attr]
        intake.ClearField("upper_caution_celsius")
        intake.ClearField("upper_critical_celsius")
        intake.reading_celsius = hottest + margin
        assert (
            statistics.median(max(t.reading_celsius for t in intakes(n.bmc)) for n in nodes if n.bmc)
            == hottest
        )
    config = DetectConfig(inlet_margin_celsius=margin)
    for _ in range(2):  # a second pass reads what the first kept, after a few new samples
        for node in [] if _ == 0 else draw.sample(nodes, 4):
            node.bmc, node.bmc_time = drawn_sample(draw), node.last_seen
        found = [
            (f.node, f.severity, f.summary)
            for f in fleet.detect("bmc_health", config)
            if f.cause == "inlet_temperature_high"
        ]
        assert found == one_by_one(nodes, config)
