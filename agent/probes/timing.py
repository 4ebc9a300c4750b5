"""Timing shared by the kernels: warm-up, repeats sized to a deadline, one time per call, median.

On a GPU each call is bracketed by CUDA events on the current stream (GPU time, launch gaps
excluded); on the CPU by perf_counter, the CPU's ops being synchronous. torch is imported inside
the functions: this module is imported by the kernels, which the agent imports without torch.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from agent.probes.base import ProbeOutcome
from agent.probes.kernel import ProbeError, ProbeParams

WARMUP_SHARE = 0.2  # of the time left when measuring starts: clocks ramp, caches and cuBLAS plans settle
MIN_WARMUP_CALLS = 3
MAX_WARMUP_CALLS = 1000
MIN_REPEATS = 5  # a median of fewer is no median
MAX_REPEATS = 2000
CHUNKS = 10  # the timed calls go in about this many chunks, the deadline checked after each


@dataclass(frozen=True, slots=True)
class Timing:
    """Seconds per timed call, and how it was taken."""

    seconds: list[float]
    warmup_calls: int
    timer: str  # "cuda_events" or "perf_counter"

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def cv(self) -> float:
        """Coefficient of variation of the per-call times (0 for a single call)."""
        if len(self.seconds) < 2:
            return 0.0
        return statistics.stdev(self.seconds) / statistics.fmean(self.seconds)

    def params(self) -> dict[str, str]:
        return {
            "repeats": str(len(self.seconds)),
            "warmup_calls": str(self.warmup_calls),
            "median_seconds": f"{self.median:.6g}",
            "cv": f"{self.cv:.4f}",
            "timer": self.timer,
        }


def is_cuda(device: str) -> bool:
    return device.startswith("cuda")


def check_device(device: str) -> None:
    """A per-device kernel runs on "cpu" or "cuda:N"; anything else is a caller's mistake."""
    if device == "cpu":
        return
    prefix, _, index = device.partition(":")
    if prefix != "cuda" or not index.isdigit():
        raise ProbeError(f"device must be 'cpu' or 'cuda:N', not {device!r}")


@contextlib.contextmanager
def on_device(device: str) -> Iterator[None]:
    """Make `device` current (CUDA events and streams belong to the current device); free memory after.

    Wrap a call whose locals hold the tensors, so that they are gone when the memory is released.
    """
    import torch

    check_device(device)
    current = torch.cuda.device(torch.device(device)) if is_cuda(device) else contextlib.nullcontext()
    try:
        with current:
            yield
    except BaseException:
        with contextlib.suppress(RuntimeError):  # a broken context must not hide the first error
            release(device)
        raise
    release(device)


def run_on_device(
    params: ProbeParams,
    size: int,
    measure_fn: Callable[[ProbeParams, int, float], ProbeOutcome],
    setting: contextlib.AbstractContextManager[Any] | None = None,
) -> ProbeOutcome:
    """Run `measure_fn(params, size, deadline)` on the params' device (memory freed after, `setting`
    held meanwhile); stamp the outcome with the start time and the whole run's wall time."""
    started, t0 = time.time(), time.perf_counter()
    with on_device(params.device), setting or contextlib.nullcontext():
        outcome = measure_fn(params, size, t0 + params.budget_seconds)
    outcome.time = started
    outcome.duration_seconds = time.perf_counter() - t0
    return outcome


def release(device: str) -> None:
    """Give the kernel's memory back: its tensors are gone by then (reference counting), cuBLAS's
    workspaces (32 MiB a stream on Hopper with torch 2.11, kept by torch after the first matmul) are
    cleared, and the allocator's cache goes back to the driver."""
    import torch

    if is_cuda(device) and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        with torch.cuda.device(torch.device(device)):
            torch.cuda.synchronize()
            clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)  # private API
            if clear_workspaces is not None:
                clear_workspaces()
            torch.cuda.empty_cache()


def synchronize(device: str) -> None:
    import torch

    if is_cuda(device):
        torch.cuda.synchronize(torch.device(device))


def total_memory_bytes(device: str) -> int | None:
    """The device's memory; None on the CPU (the kernels size CPU runs by suite, not memory)."""
    import torch

    if not is_cuda(device):
        return None
    return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)


def measure(
    call: Callable[[int], Any],
    *,
    device: str,
    deadline: float,
    reserve_seconds: float = 0.0,
    min_repeats: int = MIN_REPEATS,
    max_repeats: int = MAX_REPEATS,
) -> Timing:
    """Warm up, then time `call(i)` (i counts every call, for rotating inputs) as often as fits.

    `deadline` is a perf_counter time; `reserve_seconds` of it stay free for what follows (the
    correctness check). Warm-up takes WARMUP_SHARE of the time left (at least 3 calls). The timed
    calls go in chunks of about a tenth of what the warm-up's pace says fits; after each chunk the
    device is synchronised and the next chunk sized to what still fits at the pace just seen, so a
    device that slows down stops near the deadline, and one too slow for it still gives
    min_repeats calls (its only overrun).
    """
    start = time.perf_counter()
    end = deadline - reserve_seconds
    warm_until = start + WARMUP_SHARE * max(0.0, end - start)
    paces: list[float] = []
    calls = 0
    while calls < MIN_WARMUP_CALLS or (time.perf_counter() < warm_until and calls < MAX_WARMUP_CALLS):
        t0 = time.perf_counter()
        call(calls)
        synchronize(device)
        paces.append(time.perf_counter() - t0)
        calls += 1
    pace = statistics.median(paces[-MIN_WARMUP_CALLS:])
    fits = int((end - time.perf_counter()) / pace) if pace > 0 else max_repeats
    planned = max(min_repeats, min(max_repeats, fits))
    chunk = max(min_repeats, planned // CHUNKS)
    timer = "cuda_events" if is_cuda(device) else "perf_counter"
    seconds: list[float] = []
    size = min(chunk, planned)
    while size > 0:
        first = calls + len(seconds)
        times = _cuda_times(call, first, size) if is_cuda(device) else _cpu_times(call, first, size)
        seconds.extend(times)
        # The next chunk is what still fits at the pace just seen (the device may have slowed down).
        pace = max(statistics.fmean(times), 1e-9)
        fits = int((end - time.perf_counter()) / pace)
        size = min(chunk, planned - len(seconds), max(fits, min_repeats - len(seconds)))
    if any(s <= 0 for s in seconds):
        raise ProbeError(f"the timer returned a non-positive time ({timer}): cannot measure")
    return Timing(seconds, calls, timer)


def _cpu_times(call: Callable[[int], Any], first: int, repeats: int) -> list[float]:
    seconds = []
    for i in range(first, first + repeats):
        t0 = time.perf_counter()
        call(i)
        seconds.append(time.perf_counter() - t0)
    return seconds


def _cuda_times(call: Callable[[int], Any], first: int, repeats: int) -> list[float]:
    """GPU time of each call, between events on the current stream; returns once the GPU is done."""
    import torch

    event = torch.cuda.Event
    events = [
        (event(enable_timing=True), event(enable_timing=True))  # type: ignore[no-untyped-call]
        for _ in range(repeats)
    ]
    for i, (begin, end) in enumerate(events):
        begin.record()
        call(first + i)
        end.record()
    events[-1][1].synchronize()
    return [begin.elapsed_time(end) / 1e3 for begin, end in events]
