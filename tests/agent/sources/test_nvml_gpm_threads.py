"""GPM with several sources in one process (the sampling loop's and the probe runner's), on the fake NVML.

On an H200 (driver 580.159.04) two threads in nvmlGpmMetricsGet at once crashed the process, and
DRAM bandwidth came back as NaN for samples taken close together
(bench/results/2026-12-04_h200_gpm_threads.txt).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import pynvml
import pytest

from agent.compose.probes import open_nvml
from agent.sources.nvml import source as nvml_module
from agent.sources.nvml.source import NvmlSource
from tests.agent.sources import test_nvml_fake as nvml_fake
from tests.agent.sources.test_nvml_fake import GPM_PERCENT, FakeNvml, fast_xid_thread

GPM_CALLS = ("nvmlGpmSampleAlloc", "nvmlGpmSampleFree", "nvmlGpmSampleGet", "nvmlGpmMetricsGet")


@pytest.fixture(autouse=True)
def _fast_xid(monkeypatch: pytest.MonkeyPatch) -> None:
    fast_xid_thread(monkeypatch)


class Overlap:
    """Counts the threads inside any GPM call at once; each call lingers so that overlaps show."""

    def __init__(self, fake: FakeNvml) -> None:
        self.inside = 0
        self.most = 0
        self.calls = 0
        self._count = threading.Lock()
        for name in GPM_CALLS:
            setattr(fake.module, name, self._wrap(getattr(fake.module, name)))

    def _wrap(self, call: Callable[..., Any]) -> Callable[..., Any]:
        def inside(*args: Any) -> Any:
            with self._count:
                self.inside += 1
                self.calls += 1
                self.most = max(self.most, self.inside)
            try:
                time.sleep(0.001)  # lets the other thread in, were it not held out
                return call(*args)
            finally:
                with self._count:
                    self.inside -= 1

        return inside


def test_gpm_calls_of_two_sources_in_two_threads_never_overlap() -> None:
    fake = FakeNvml()
    overlap = Overlap(fake)
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def sample() -> None:
        try:
            with NvmlSource(nvml=fake.module, xid_events=False, gpm_min_window_s=0.0) as source:
                start.wait()
                for _ in range(15):
                    source.read()
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=sample) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert overlap.calls >= 2 * 15 * len(fake.gpus)  # both sources did take GPM samples
    assert overlap.most == 1


def test_a_non_finite_gpm_metric_is_left_empty_and_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(
        nvml_fake, "GPM_PERCENT", {**GPM_PERCENT, pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: math.nan}
    )
    fake = FakeNvml()
    with (
        caplog.at_level(logging.INFO, logger="agent.sources.nvml.gpm"),
        NvmlSource(nvml=fake.module, xid_events=False, gpm_min_window_s=0.0) as source,
    ):
        readings = [source.read()[0] for _ in range(4)]
    assert [r.gpm_dram_activity_ratio for r in readings[1:]] == [None] * 3
    assert all(r.gpm_sm_activity_ratio == 0.625 for r in readings[1:])
    said = [r.getMessage() for r in caplog.records if "gpm_dram_activity_ratio" in r.getMessage()]
    assert said == ["nvml: GPM metric gpm_dram_activity_ratio read as nan; left empty (said once)"]


def test_the_probe_runners_source_makes_no_gpm_call(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml()
    overlap = Overlap(fake)
    monkeypatch.setattr(nvml_module, "_pynvml", fake.module)
    source = open_nvml(complete=True)
    try:
        readings = [source.read() for _ in range(3)]
    finally:
        source.close()
    assert overlap.calls == 0
    assert all(r.gpm_sm_activity_ratio is None for rs in readings for r in rs)
    assert all(r.power_watts is not None for rs in readings for r in rs)  # the rest is read
