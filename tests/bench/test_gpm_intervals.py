"""bench/gpm_intervals.py on the fake NVML: every metric read at each interval, a NaN one counted
empty, missing NVML is rc 3."""

from __future__ import annotations

import math
from collections.abc import Iterator
from types import ModuleType

import pynvml
import pytest

from agent.sources.nvml import source as nvml_module
from tests.agent.sources import test_nvml_fake as nvml_fake
from tests.agent.sources.test_nvml_fake import GPM_PERCENT, FakeNvml
from tests.bench.scripts import bench_script


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.setattr(nvml_module, "_pynvml", FakeNvml().module)
    with bench_script("gpm_intervals") as module:
        yield module


def test_each_interval_reads_every_metric(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--intervals", "0.01,0.02", "--reads", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "gpm_intervals: GPU 0, load none, 3 reads per interval"
    rows = lines[1:]
    assert len(rows) == 2 * len(bench.METRICS)
    assert all("empty   0 of 3" in row for row in rows)


def test_a_nan_metric_counts_as_empty(bench: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        nvml_fake, "GPM_PERCENT", {**GPM_PERCENT, pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: math.nan}
    )
    pauses: list[float] = []
    tally = bench.measure(0.5, 4, pauses.append)
    assert pauses == [0.5] * 4 and tally.reads == 4
    assert tally.empty == {"gpm_dram_activity_ratio": 4}
    assert len(tally.values["gpm_sm_activity_ratio"]) == 4
    assert all(0.0 <= v <= 1.0 for v in tally.values["gpm_sm_activity_ratio"])


def test_bad_arguments_and_missing_nvml(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench.main(["--reads", "0"]) == 2
    monkeypatch.setattr(nvml_module, "_pynvml", None)
    assert bench.main(["--reads", "1"]) == bench.NVML_UNAVAILABLE
    assert "pynvml module is missing" in capsys.readouterr().err
