"""Idle gaps between jobs: the simulated node's job pauses once per period, each node in its own
phase, and everything that follows load (GPU readings, host, BMC) sees the pause; faults stay."""

from __future__ import annotations

import itertools

import pytest

from agent.compose.sources import build_sources
from agent.config import ConfigError, load
from agent.sources.sim import FaultSpec, SimHost, SimNode
from protos.names import clock_event_reason_names

T0 = 1_800_000_000.0


def node_at(t: list[float], name: str = "n1", **kwargs: object) -> SimNode:
    return SimNode(name, gpus=2, seed=4, clock=lambda: t[0], **kwargs)  # type: ignore[arg-type]


def test_the_job_pauses_for_idle_seconds_once_every_period() -> None:
    t = [T0]
    node = node_at(t, idle_every_seconds=60.0, idle_seconds=15.0)
    loads = []
    for second in range(600):
        t[0] = T0 + second
        loads.append(node.load)
    assert set(loads) == {0.0, 0.95}
    assert loads.count(0.0) == 150  # 15 s of every 60
    starts = [i for i in range(1, 600) if loads[i] == 0.0 and loads[i - 1] > 0]
    assert len(starts) in (9, 10) and all(b - a == 60 for a, b in itertools.pairwise(starts))


def test_a_gap_reads_idle_and_the_job_comes_back_after_it() -> None:
    t = [T0]
    node = node_at(t, idle_every_seconds=60.0, idle_seconds=15.0, faults=[FaultSpec("thermal_throttle", 1)])
    while node.load > 0:
        t[0] += 1.0
    idle = node.read()
    for reading in idle:
        assert reading.gpu_utilization_ratio == 0.0 and reading.processes == []
        assert clock_event_reason_names(reading.clock_event_reasons or 0) == ["gpu_idle"]
    t[0] += 15.0
    busy = node.read()
    assert all((r.gpu_utilization_ratio or 0) > 0.9 and len(r.processes) == 1 for r in busy)
    assert "hw_thermal_slowdown" in clock_event_reason_names(busy[1].clock_event_reasons or 0)
    # A probe in the gap measures the fault as it would under load: the GPU is still slow.
    assert node.probe("gemm", "bf16", 1).value < 0.95 * node.probe("gemm", "bf16", 0).value


def test_nodes_pause_in_their_own_phase_and_the_draws_stay_the_same() -> None:
    t = [T0]
    phases = set()
    for i in range(8):
        node = node_at(t, f"node-{i}", idle_every_seconds=60.0, idle_seconds=15.0)
        phases.add(next(s for s in range(1, 61) if node.load_at(T0 + s) == 0.0 < node.load_at(T0 + s - 1)))
    assert len(phases) >= 6  # gaps start at different times: not in lockstep
    steady, gapped = node_at(t), node_at(t, idle_every_seconds=60.0, idle_seconds=15.0)
    assert [g.traits for g in steady.gpus] == [g.traits for g in gapped.gpus]


def test_the_config_reaches_the_node_and_the_host_follows_the_gap() -> None:
    config = load(
        None,
        {"node": "n1", "source": "sim", "sim": {"gpus": 2, "idle_every_seconds": 30, "idle_seconds": 10}},
    )
    gpu, _, _ = build_sources(config)
    assert isinstance(gpu, SimNode) and (gpu.idle_every_seconds, gpu.idle_seconds) == (30, 10)
    t = [T0]
    node = node_at(t, idle_every_seconds=60.0, idle_seconds=15.0)
    host = SimHost(node, seed=4, clock=lambda: t[0])
    while node.load == 0:
        t[0] += 1.0
    busy = host.read().cpu_utilization_ratio
    while node.load > 0:
        t[0] += 1.0
    idle = host.read().cpu_utilization_ratio
    assert busy is not None and idle is not None and idle < 0.5 * busy


@pytest.mark.parametrize(
    ("sim", "message"),
    [
        ({"idle_every_seconds": 30, "idle_seconds": 30}, "sim.idle_seconds must be > 0 and below"),
        ({"idle_every_seconds": 30}, "sim.idle_seconds must be > 0 and below"),
    ],
)
def test_bad_gaps_are_refused(sim: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(None, {"node": "n1", "source": "sim", "sim": sim})
    with pytest.raises(ValueError, match="idle gaps need"):
        SimNode("n1", idle_every_seconds=sim["idle_every_seconds"], idle_seconds=sim.get("idle_seconds", 0.0))
