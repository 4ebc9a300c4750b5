"""Smoke test of bench/agent_collect.py: a few simulated cycles print every figure. No timings asserted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from tests.bench.scripts import bench_script


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    with bench_script("agent_collect") as module:
        yield module


def _positive_summary(figures: dict[str, float]) -> None:
    assert set(figures) == {"mean", "p50", "p99", "max"}
    assert all(value > 0 for value in figures.values()), figures
    assert figures["p50"] <= figures["p99"] <= figures["max"]


def test_three_sim_cycles_as_json(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--source", "sim", "--cycles", "3", "--json"]) == 0
    document: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert document["bench"] == "agent_collect"
    assert document["skipped"] == {}
    [run] = document["runs"]
    assert run["source"] == "sim"
    assert run["gpus"] == 8
    assert run["gpu_name"]
    assert run["cycles"] == 3
    assert run["failed_cycles"] == 0
    for key in ("wall_ms", "sample_ms", "encode_ms", "cpu_ms", "frame_bytes"):
        _positive_summary(run[key])
    assert run["cpu_share_of_core_at_10s"] > 0
    assert run["cpu_share_measured"] is None  # only measured when cycles are spaced
    assert all(run["rss_bytes"][key] > 0 for key in ("start", "after_warmup", "end"))
    for key in ("rss_growth_bytes", "rss_growth_per_1000_cycles_bytes", "rss_growth_per_hour_at_10s_bytes"):
        assert isinstance(run[key], int | float)
    assert run["nvml_calls_per_cycle"] is None  # the simulator counts no NVML calls
    assert set(run["verdicts"]) == {"cpu", "rss", "rss_flat"}
    assert set(run["verdicts"].values()) <= {"within", "over"}


def test_spaced_cycles_print_text(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--source", "sim", "--cycles", "2", "--interval", "0.05"]) == 0
    out = capsys.readouterr().out
    for words in ("wall per cycle", "cpu per cycle", "cpu share measured", "rss growth", "frame bytes"):
        assert words in out
    assert "nvml calls/cycle  n/a" in out
    assert out.count("within") + out.count("over") >= 4


def test_summary_uses_nearest_rank(bench: ModuleType) -> None:
    figures = bench.summary([float(v) for v in range(1, 101)])
    assert figures == {"mean": 50.5, "p50": 50.0, "p99": 99.0, "max": 100.0}
    assert bench.summary([]) == {"mean": 0.0, "p50": 0.0, "p99": 0.0, "max": 0.0}


def test_bad_arguments_exit_2(bench: ModuleType) -> None:
    assert bench.main(["--source", "sim", "--cycles", "0"]) == 2
