"""bench/nvml_threads.py on the fake NVML: both threads read, nothing non-finite, missing NVML is rc 3."""

from __future__ import annotations

import math
from collections.abc import Iterator
from types import ModuleType

import pynvml
import pytest

from agent.sources.gpu import GpuReading
from agent.sources.nvml import source as nvml_module
from tests.agent.sources import test_nvml_fake as nvml_fake
from tests.agent.sources.test_nvml_fake import GPM_PERCENT, FakeNvml
from tests.bench.scripts import bench_script


@pytest.fixture
def bench() -> Iterator[ModuleType]:
    with bench_script("nvml_threads") as module:
        yield module


@pytest.mark.parametrize("flags", [[], ["--runner-gpm"], ["--no-gpm"]])
def test_both_threads_read_and_the_figures_are_printed(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    monkeypatch.setattr(nvml_module, "_pynvml", FakeNvml().module)
    assert bench.main(["--seconds", "0.3", "--period", "0.01", *flags]) == 0
    out = capsys.readouterr().out
    tally = bench.run(0.2, 0.01, "--runner-gpm" in flags, "--no-gpm" not in flags)
    assert tally.reads["loop"] > 3 and tally.reads["runner"] > 3 and tally.reads["runner_opens"] > 1
    assert tally.errors == [] and tally.non_finite == {}
    assert "non-finite readings: none" in out and "errors: none" in out


def test_a_non_finite_reading_is_counted_by_field(bench: ModuleType) -> None:
    tally = bench.Tally()
    nan = GpuReading(index=0, uuid="GPU-0", power_watts=math.nan, sm_clock_hz=math.inf)
    tally.readings("loop", [nan, GpuReading(index=1, uuid="GPU-1", power_watts=math.nan)])
    assert tally.non_finite == {"power_watts": 2, "sm_clock_hz": 1}
    assert tally.reads["loop"] == 1


def test_a_nan_gpm_metric_is_left_empty_by_the_source(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nvml_module, "_pynvml", FakeNvml().module)
    monkeypatch.setattr(nvml_fake, "GPM_PERCENT", {**GPM_PERCENT, pynvml.NVML_GPM_METRIC_SM_UTIL: math.nan})
    tally = bench.run(0.2, 0.01, True, True)
    assert tally.errors == [] and tally.non_finite == {}


def test_without_nvml_it_says_so_and_exits_3(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(nvml_module, "_pynvml", None)
    assert bench.main(["--seconds", "0.1"]) == bench.NVML_UNAVAILABLE
    assert "pynvml module is missing" in capsys.readouterr().err
