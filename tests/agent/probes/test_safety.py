"""Refusing GPUs that do other work: foreign processes, utilisation, force and drained nodes."""

from __future__ import annotations

import pytest

from agent.probes.safety import SafetyPolicy, refusals
from agent.sources.gpu import ComputeProcess, GpuReading

POLICY = SafetyPolicy()


def reading(index: int, utilization: float | None = 0.0, pids: tuple[int, ...] = ()) -> GpuReading:
    return GpuReading(
        index=index,
        uuid=f"GPU-{index}",
        gpu_utilization_ratio=utilization,
        processes=[ComputeProcess(pid) for pid in pids],
    )


def test_idle_gpus_pass() -> None:
    assert refusals([reading(0), reading(1, 0.1)], [0, 1], POLICY) == {}


def test_foreign_processes_and_busy_gpus_are_refused() -> None:
    readings = [reading(0, 0.0, (4242,)), reading(1, 0.87), reading(2), reading(3, None)]
    out = refusals(readings, [0, 1, 2, 3], POLICY)
    assert sorted(out) == [0, 1]
    assert out[0].startswith("refused: GPU 0 runs other processes (pid 4242)")
    assert out[1].startswith("refused: GPU 1 is 87% busy (above 10%)")


def test_own_processes_are_not_foreign() -> None:
    assert refusals([reading(0, 0.0, (100,))], [0], POLICY, own_pids={100}) == {}


def test_a_gpu_that_cannot_be_read_is_refused() -> None:
    out = refusals([reading(0)], [0, 5], POLICY)
    assert list(out) == [5] and "could not be read" in out[5]


def test_force_and_a_drained_node_refuse_nothing() -> None:
    readings = [reading(0, 0.9, (1,))]
    assert refusals(readings, [0], POLICY, force=True) == {}
    assert refusals(readings, [0], SafetyPolicy(drained=True)) == {}


def test_the_threshold_is_configurable() -> None:
    assert refusals([reading(0, 0.3)], [0], SafetyPolicy(max_utilization=0.5)) == {}
    with pytest.raises(ValueError, match="max_utilization"):
        SafetyPolicy(max_utilization=10)
