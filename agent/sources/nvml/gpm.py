"""GPU Performance Monitoring (Hopper and newer): the NVML metrics that stand in for DCGM profiling.

GPM metrics are computed between two samples, so each GPU keeps two and every read returns the
averages since the previous read: SM activity, tensor-pipe activity, DRAM bandwidth, graphics
engine activity, as ratios 0..1.

Every GPM call in the process goes through one lock, whichever source makes it: two threads in
nvmlGpmMetricsGet at once crashed libnvidia-ml (580.159.04, H200: SIGSEGV within seconds, every
time; bench/results/2026-12-04_h200_gpm_threads.txt), and the agent's sampling loop and its probe
runner each hold a source. A metric NVML returns as NaN or infinity (DRAM bandwidth on that H200,
for samples taken close together) is left empty, as a metric NVML refuses is.

A read sooner than `min_window_s` after the sample it would be compared with takes no sample: it
repeats the metrics of the last full window, or leaves them empty when there is none yet. The
agent's inventory takes a sample about 30 ms before its first read; compared over those 30 ms the
H200 answered DRAM bandwidth as NaN (`agent --once` on 2026-11-30 and 2026-12-04, the first streamed
frame of 2026-12-04) and the other metrics described 30 ms of a 10 s frame. With the window the first frame
carries no GPM metrics and every later one the average since the previous full window.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.sources.nvml.query import Query, address

log = logging.getLogger(__name__)

_CALLS = threading.Lock()  # every GPM call of the process, one at a time (see above)
# The shortest time GPM metrics are computed over. A choice, not yet a measurement: samples 10 ms
# apart read DRAM bandwidth as NaN on the H200, 10 s apart never did; bench/gpm_intervals.py measures
# between, on the next lent GPU. Short of 1 s so that an agent sampling every second (the shortest
# sensible interval for these metrics) computes each read despite its loop's jitter.
MIN_WINDOW_S = 0.9

METRICS: tuple[tuple[str, str], ...] = (
    ("gpm_sm_activity_ratio", "NVML_GPM_METRIC_SM_UTIL"),
    ("gpm_tensor_activity_ratio", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
    ("gpm_dram_activity_ratio", "NVML_GPM_METRIC_DRAM_BW_UTIL"),
    ("gpm_graphics_activity_ratio", "NVML_GPM_METRIC_GRAPHICS_UTIL"),
)


@dataclass(slots=True)
class _Samples:
    previous: Any
    current: Any
    request: Any = None  # the c_nvmlGpmMetricsGet_t, built once: it holds all NVML_GPM_METRIC_MAX slots
    primed: bool = False  # `previous` holds a sample
    taken: float = 0.0  # when `previous` was taken (the sampler's clock)
    last: tuple[float | None, ...] | None = None  # the metrics of the last full window


class GpmSampler:
    """Per-GPU GPM samples, allocated on first use and freed by `close`."""

    def __init__(
        self, nvml: Any, *, min_window_s: float = MIN_WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if min_window_s < 0:
            raise ValueError(f"min_window_s must not be negative, not {min_window_s}")
        self._nvml = nvml
        self._min_window_s = min_window_s
        self._clock = clock
        self._gpus: dict[int, _Samples] = {}
        self._said: set[tuple[str, int]] = set()  # (metric, NVML return) already logged

    def query(self) -> Query:
        """The query that fills the gpm_* reading fields; asked every cycle with the GPU's handle."""
        return Query("gpm", tuple(name for name, _ in METRICS), self.read, tuple)

    def read(self, nvml: Any, handle: Any) -> tuple[float | None, ...] | None:
        """The metrics since the previous sample of this GPU; None on the first (nothing to compare) and
        until a full window has passed; the last full window's metrics again when called sooner."""
        with _CALLS:
            return self._read(nvml, handle)

    def _read(self, nvml: Any, handle: Any) -> tuple[float | None, ...] | None:
        samples = self._gpus.get(address(handle))
        if samples is None:
            if getattr(nvml, "nvmlGpmQueryDeviceSupport", None) is None:  # a pynvml older than GPM
                raise nvml.NVMLError(nvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            if not nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                raise nvml.NVMLError(nvml.NVML_ERROR_NOT_SUPPORTED)
            samples = self._allocate(nvml)
            self._gpus[address(handle)] = samples
        if not samples.primed:
            nvml.nvmlGpmSampleGet(handle, samples.previous)
            samples.primed, samples.taken = True, self._clock()
            return None
        now = self._clock()
        if now - samples.taken < self._min_window_s:
            return samples.last  # `previous` stays: the next window runs from it
        nvml.nvmlGpmSampleGet(handle, samples.current)
        try:
            samples.last = None  # a window whose metrics fail is not repeated
            samples.last = self._metrics(nvml, samples)
            return samples.last
        finally:
            # The sample just taken starts the next interval, whether or not these metrics came back.
            samples.previous, samples.current = samples.current, samples.previous
            samples.taken = now

    def ready_in(self) -> float:
        """Seconds until every primed GPU's next read computes a full window (0: now, or nothing primed)."""
        now = self._clock()
        with _CALLS:
            waits = [s.taken + self._min_window_s - now for s in self._gpus.values() if s.primed]
        return max([0.0, *waits])

    def close(self) -> None:
        """Free every GPU's samples (before NVML shuts down)."""
        nvml = self._nvml
        with _CALLS:
            self._free(nvml)

    def _free(self, nvml: Any) -> None:
        for samples in self._gpus.values():
            for sample in (samples.previous, samples.current):
                try:
                    nvml.nvmlGpmSampleFree(sample)
                except nvml.NVMLError as exc:
                    log.warning("nvml: cannot free a GPM sample: %s", exc)
        self._gpus.clear()

    @staticmethod
    def _allocate(nvml: Any) -> _Samples:
        first = nvml.nvmlGpmSampleAlloc()
        try:
            second = nvml.nvmlGpmSampleAlloc()
        except nvml.NVMLError:
            nvml.nvmlGpmSampleFree(first)
            raise
        return _Samples(first, second)

    def _metrics(self, nvml: Any, samples: _Samples) -> tuple[float | None, ...]:
        if samples.request is None:
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(METRICS)
            for slot, (_, metric) in zip(request.metrics, METRICS, strict=False):
                slot.metricId = getattr(nvml, metric)
            samples.request = request
        request = samples.request
        request.sample1 = samples.previous
        request.sample2 = samples.current
        nvml.nvmlGpmMetricsGet(request)
        values: list[float | None] = []
        for slot, (name, _) in zip(request.metrics[: len(METRICS)], METRICS, strict=True):
            code = int(slot.nvmlReturn)
            value = float(slot.value) if code == nvml.NVML_SUCCESS else math.nan
            values.append(value / 100.0 if math.isfinite(value) else None)
            if code != nvml.NVML_SUCCESS and (name, code) not in self._said:  # once per metric and error
                self._said.add((name, code))
                log.info(
                    "nvml: GPM metric %s not read (NVML error %d: %s); left empty",
                    name,
                    code,
                    _says(nvml, code),
                )
            elif code == nvml.NVML_SUCCESS and not math.isfinite(value) and (name, -1) not in self._said:
                self._said.add((name, -1))
                log.info("nvml: GPM metric %s read as %s; left empty (said once)", name, value)
        return tuple(values)


def _says(nvml: Any, code: int) -> str:
    try:
        return str(nvml.nvmlErrorString(code))
    except Exception:  # noqa: BLE001 - a message is a nicety; the code is logged anyway
        return "unknown error"
