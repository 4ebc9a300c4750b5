"""Readings during a run: the sampler's thread, windows, and the reading a result carries."""

from __future__ import annotations

import time
from collections.abc import Callable

from agent.probes.sampling import Sample, Sampler, during
from agent.sources.errors import SourceError
from agent.sources.gpu import GpuReading, NvLinkReading
from tests.agent.probes.fakes import Gpus

THERMAL, POWER = 0x40, 0x04  # HW thermal slowdown, SW power cap


def sample(t: float, util: float, mhz: float, reasons: int = 0) -> Sample:
    reading = GpuReading(
        index=0,
        uuid="GPU-0",
        gpu_utilization_ratio=util,
        sm_clock_hz=mhz * 1e6,
        clock_event_reasons=reasons,
        nvlinks=[NvLinkReading(link=0, active=True)],
    )
    return Sample(t, reading)


def test_the_busy_reading_with_the_lowest_clock_and_every_reason() -> None:
    samples = [
        sample(1.0, 0.0, 345),  # idle before the kernel started: not the slowest moment of the run
        sample(1.1, 1.0, 1980, POWER),
        sample(1.2, 1.0, 1650, THERMAL),
        sample(1.3, 1.0, 1755),
    ]
    chosen = during(samples)
    assert chosen is not None
    assert chosen.sm_clock_hz == 1650e6
    assert chosen.clock_event_reasons == THERMAL | POWER
    assert chosen.nvlinks == []  # kept small
    assert samples[2].reading.clock_event_reasons == THERMAL  # the samples are not changed


def test_without_a_busy_reading_the_last_one_and_without_any_none() -> None:
    chosen = during([sample(1.0, 0.0, 345), sample(1.1, 0.2, 600)])
    assert chosen is not None and chosen.sm_clock_hz == 600e6
    assert during([]) is None


def test_the_sampler_polls_until_stopped_and_gives_windows() -> None:
    gpus = Gpus(gpus=2)
    start = time.time()
    with Sampler(gpus, interval=0.02) as sampler:
        until(lambda: gpus.reads >= 5)  # ~0.1 s idle; a loaded machine's thread may take longer
    end = time.time()
    assert gpus.reads >= 5
    window = sampler.window(1, start, end)
    assert len(window) == gpus.reads and all(s.reading.index == 1 for s in window)
    assert sampler.window(1, end + 1, end + 2) == []
    reads = gpus.reads
    time.sleep(0.05)
    assert gpus.reads == reads  # stopped


class Broken(Gpus):
    def read(self) -> list[GpuReading]:
        raise SourceError("nvml", "Unknown Error")


def test_a_failing_source_is_counted_not_raised() -> None:
    with Sampler(Broken(), interval=0.02) as sampler:
        until(lambda: sampler.errors >= 2)
    assert sampler.errors >= 2 and sampler.samples == {}


def until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait for the sampler's thread to get there, however slowly a loaded machine runs it."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
