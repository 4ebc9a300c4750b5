"""Named conditions of a GPU reading, and how long each has held.

Detectors ask "has X held for the window?" rather than "is X set now?", so a brief power-cap blip
under load, or a link retraining for a moment, is not a finding.
"""

from __future__ import annotations

from operator import attrgetter

from protos.gpufleet.v1 import telemetry_pb2 as pb
from protos.names import clock_event_reason_names

_ACTIVE = attrgetter("active")


def is_busy(sample: pb.GpuSample) -> bool:
    idle = "gpu_idle" in clock_event_reason_names(sample.clock_event_reasons)
    util = sample.gpu_utilization_ratio if sample.HasField("gpu_utilization_ratio") else 0.0
    return not idle and util >= 0.1


# An SM clock more than this share below max is "low" (as controller/detect/explain.py judges it).
CLOCK_LOW_MARGIN = 0.05


def clock_state(sample: pb.GpuSample, reasons: set[str]) -> str | None:
    """For a busy GPU whose SM clock is well below max: "clocks_locked" when a setting holds it there
    (NVML's applications_clocks_setting reason, or an application clock below max), else
    "clock_low_no_reason" when no reason bit is set at all; None otherwise (a clock near max, an
    idle GPU, a thermal or power reason explaining the clock). detect/clock_lock.py reads both."""
    top = sample.max_sm_clock_hz
    if not (top and sample.HasField("sm_clock_hz")) or not is_busy(sample):
        return None
    if sample.sm_clock_hz >= (1.0 - CLOCK_LOW_MARGIN) * top:
        return None
    app = sample.applications_sm_clock_hz
    if "applications_clocks_setting" in reasons or (app and app < (1.0 - CLOCK_LOW_MARGIN) * top):
        return "clocks_locked"
    # Reasons not reported (the field unset) are not "no reason".
    return None if reasons or not sample.HasField("clock_event_reasons") else "clock_low_no_reason"


def conditions(sample: pb.GpuSample) -> set[str]:
    """Reason bits that are set, plus derived states: pcie_below_max (only while busy: idle links
    train down to save power), nvlink_inactive, row_remap_pending, clocks_locked or
    clock_low_no_reason (see clock_state)."""
    found = set(clock_event_reason_names(sample.clock_event_reasons))
    found.discard("gpu_idle")
    clock = clock_state(sample, found)
    if clock is not None:
        found.add(clock)
    if is_busy(sample) and (
        (sample.HasField("pcie_link_gen_max") and sample.pcie_link_gen < sample.pcie_link_gen_max)
        or (sample.HasField("pcie_link_width_max") and sample.pcie_link_width < sample.pcie_link_width_max)
    ):
        found.add("pcie_below_max")
    if not all(map(_ACTIVE, sample.nvlinks)):  # read in C: a GPU has up to 18 links
        found.add("nvlink_inactive")
    if sample.row_remap_pending or sample.row_remap_failure:
        found.add("row_remap_pending")
    return found


def update_held(previous: dict[str, float], sample: pb.GpuSample, at: float) -> dict[str, float]:
    """Since-times for the conditions of `sample` taken at `at`, continuing those already held."""
    return {name: min(previous.get(name, at), at) for name in conditions(sample)}
