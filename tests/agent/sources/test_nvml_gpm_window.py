"""GPM metrics cover at least a minimum window (agent/sources/nvml/gpm.py), on the fake NVML.

The agent's inventory takes a GPM sample about 30 ms before its first read; compared over those
30 ms the H200 read DRAM bandwidth as NaN and the rest described 30 ms of a 10 s frame.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import pytest

from agent.cli import _await_gpm
from agent.sources.nvml.gpm import MIN_WINDOW_S, GpmSampler
from agent.sources.nvml.source import NvmlSource
from tests.agent.sources.test_nvml_fake import FakeNvml, fast_xid_thread

VALUES = (0.625, 0.41, 0.55, 0.9)  # the fake's GPM_PERCENT, as ratios


@pytest.fixture(autouse=True)
def _fast_xid(monkeypatch: pytest.MonkeyPatch) -> None:
    fast_xid_thread(monkeypatch)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _address(sample: Any) -> int:
    return ctypes.cast(sample, ctypes.c_void_p).value or 0


class Traced:
    """The samples taken (in order) and the first sample each metrics call compared from."""

    def __init__(self, fake: FakeNvml) -> None:
        self.taken: list[int] = []
        self.compared_from: list[int] = []
        module: Any = fake.module
        sample_get, metrics_get = module.nvmlGpmSampleGet, module.nvmlGpmMetricsGet

        def take(handle: Any, sample: Any) -> Any:
            self.taken.append(_address(sample))
            return sample_get(handle, sample)

        def metrics(request: Any) -> Any:
            self.compared_from.append(_address(request.sample1))
            return metrics_get(request)

        module.nvmlGpmSampleGet, module.nvmlGpmMetricsGet = take, metrics


def _sampler(window: float = 1.0) -> tuple[FakeNvml, Traced, Clock, Callable[[], Any]]:
    fake = FakeNvml()
    traced = Traced(fake)
    clock = Clock()
    sampler = GpmSampler(fake.module, min_window_s=window, clock=clock)
    handle = fake.module.nvmlDeviceGetHandleByIndex(0)
    return fake, traced, clock, lambda: sampler.read(fake.module, handle)


def test_a_read_sooner_than_the_window_takes_no_sample_and_the_window_runs_from_the_kept_one() -> None:
    _, traced, clock, read = _sampler(window=1.0)
    assert read() is None  # primes
    primed = traced.taken[0]
    clock.now += 0.03  # the inventory's sample to the first read
    assert read() is None  # nothing over a full window yet: empty, not 30 ms of it
    assert len(traced.taken) == 1 and traced.compared_from == []
    clock.now += 0.97
    assert read() == VALUES
    assert traced.compared_from == [primed]  # from the priming sample, over the whole second
    assert len(traced.taken) == 2


def test_a_read_within_the_window_repeats_the_last_full_one() -> None:
    _, traced, clock, read = _sampler(window=1.0)
    read()
    clock.now += 2.0
    assert read() == VALUES
    clock.now += 0.5
    assert read() == VALUES  # repeated: no sample, no comparison
    assert (len(traced.taken), len(traced.compared_from)) == (2, 1)
    clock.now += 0.5
    assert read() == VALUES
    assert (len(traced.taken), len(traced.compared_from)) == (3, 2)
    assert traced.compared_from[1] == traced.taken[1]  # the next window started at the last sample


def test_a_window_whose_metrics_failed_is_not_repeated() -> None:
    fake, _, clock, read = _sampler(window=1.0)
    read()
    clock.now += 1.0
    assert read() == VALUES
    fake.errors[("nvmlGpmMetricsGet", None)] = 999  # NVML_ERROR_UNKNOWN
    clock.now += 1.0
    with pytest.raises(fake.module.NVMLError):
        read()
    del fake.errors[("nvmlGpmMetricsGet", None)]
    clock.now += 0.1
    assert read() is None  # not the window before the failure again
    clock.now += 1.0
    assert read() == VALUES


def test_no_window_compares_every_read() -> None:
    _, traced, _, read = _sampler(window=0.0)
    read()
    assert [read() for _ in range(3)] == [VALUES] * 3
    assert len(traced.compared_from) == 3


def test_a_negative_window_is_refused() -> None:
    with pytest.raises(ValueError, match="min_window_s"):
        GpmSampler(FakeNvml().module, min_window_s=-1.0)


def test_the_sources_first_read_after_inventory_carries_no_gpm_metrics() -> None:
    fake = FakeNvml()
    assert MIN_WINDOW_S >= 0.5  # well above the ~30 ms from the inventory's sample to the first read
    with NvmlSource(nvml=fake.module, xid_events=False, gpm_min_window_s=3600.0) as source:
        source.inventory()
        first = source.read()[0]
    assert first.gpm_sm_activity_ratio is None and first.gpm_dram_activity_ratio is None
    assert first.power_watts is not None  # the rest of the reading is there
    with NvmlSource(nvml=fake.module, xid_events=False, gpm_min_window_s=0.0) as source:
        source.inventory()
        assert source.read()[0].gpm_sm_activity_ratio == VALUES[0]


def test_ready_in_counts_down_the_window_of_the_primed_gpus() -> None:
    clock = Clock()
    fake = FakeNvml()
    sampler = GpmSampler(fake.module, min_window_s=1.0, clock=clock)
    assert sampler.ready_in() == 0.0  # nothing primed: nothing to wait for
    sampler.read(fake.module, fake.module.nvmlDeviceGetHandleByIndex(0))
    clock.now += 0.25
    assert sampler.ready_in() == pytest.approx(0.75)
    clock.now += 1.0
    assert sampler.ready_in() == 0.0


def test_a_snapshot_waits_for_a_full_window_after_the_inventory() -> None:
    """`gpufleet agent --once`: the inventory's sample primes GPM; the snapshot waits out the window
    (agent/cli.py _await_gpm) and so carries metrics over it rather than none."""
    fake = FakeNvml()
    with NvmlSource(nvml=fake.module, xid_events=False, gpm_min_window_s=0.5) as source:
        source.inventory()
        assert 0.0 < source.gpm_ready_in() <= 0.5
        _await_gpm(source)
        assert source.gpm_ready_in() == 0.0
        assert source.read()[0].gpm_sm_activity_ratio == VALUES[0]
    with NvmlSource(nvml=fake.module, xid_events=False, gpm=False) as source:
        source.inventory()
        assert source.gpm_ready_in() == 0.0  # no GPM: no wait


def test_an_agent_sampling_every_second_computes_every_read_despite_jitter() -> None:
    fake = FakeNvml()
    traced = Traced(fake)
    clock = Clock()
    sampler = GpmSampler(fake.module, clock=clock)  # the default window
    handle = fake.module.nvmlDeviceGetHandleByIndex(0)
    sampler.read(fake.module, handle)
    for jitter in (-0.02, 0.03, -0.05, 0.0, -0.01):
        clock.now += 1.0 + jitter
        assert sampler.read(fake.module, handle) == VALUES
    assert len(traced.compared_from) == 5  # each read its own window, none repeated
