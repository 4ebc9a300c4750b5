"""GPU readings taken while probes run: a thread polls a GpuSource, results pick their window.

A probe result carries one reading as `during`: of the readings taken within its run while the GPU
was busy, the one with the lowest SM clock (the moment the GPU was most held back, which is what
explains a slow figure), with the clock-event (throttle) reasons of every busy reading OR-ed in,
so that a brief power or thermal slowdown is not lost. Without a busy reading, the last one in the
window; without any, none.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType

from agent.sources.errors import SourceError
from agent.sources.gpu import GpuReading, GpuSource

log = logging.getLogger("gpufleet.agent.probes")

BUSY = 0.5  # NVML utilisation at or above which the probe's kernel was running in the sample window


@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    time: float  # unix seconds, as ProbeOutcome.time
    reading: GpuReading


class Sampler:
    """Polls `source.read()` every `interval` seconds in a thread between start() and stop()."""

    def __init__(
        self, source: GpuSource, interval: float = 0.1, clock: Callable[[], float] = time.time
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0, not {interval}")
        self.source = source
        self.interval = interval
        self.clock = clock
        self.samples: dict[int, list[Sample]] = {}
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="probe-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.poll()  # one last reading: a run shorter than the interval still gets one

    def __enter__(self) -> Sampler:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.interval)

    def poll(self) -> None:
        try:
            readings = self.source.read()
        except SourceError as exc:
            self.errors += 1
            if self.errors == 1:
                log.warning("probe sampler: cannot read the GPUs: %s", exc)
            return
        now = self.clock()
        with self._lock:
            for reading in readings:
                self.samples.setdefault(reading.index, []).append(Sample(now, reading))

    def window(self, gpu: int, start: float, end: float) -> list[Sample]:
        with self._lock:
            return [s for s in self.samples.get(gpu, []) if start <= s.time <= end]


def during(samples: list[Sample]) -> GpuReading | None:
    """The reading a result carries (see the module's docstring): a copy without per-link NVLink
    readings and XIDs (the stream's GPU samples carry those; a result stays small)."""
    if not samples:
        return None
    busy = [s.reading for s in samples if (s.reading.gpu_utilization_ratio or 0.0) >= BUSY]
    if not busy:
        return _small(samples[-1].reading, samples[-1].reading.clock_event_reasons)
    slowest = min(busy, key=lambda r: r.sm_clock_hz if r.sm_clock_hz is not None else float("inf"))
    reasons = [r.clock_event_reasons for r in busy if r.clock_event_reasons is not None]
    merged = 0
    for value in reasons:
        merged |= value
    return _small(slowest, merged if reasons else None)


def _small(reading: GpuReading, reasons: int | None) -> GpuReading:
    return dataclasses.replace(reading, clock_event_reasons=reasons, nvlinks=[], xid_events=[], xid_counts=[])
