"""Named conditions of a GPU reading, and how long each has held.

Detectors ask "has X held for the window?" rather than "is X set now?", so a brief power-cap blip
under load, or a link retraining for a moment, is not a finding.

Ingest works out the conditions of every GPU of every frame, so a reading's inputs are read in one
call (_INPUTS), each reasons bitmask is decoded once (_reasons), not once per rule, and whether a link
is down is read from the agent's count of them (GpuSample.nvlinks_inactive) where it sends one.
"""

from __future__ import annotations

from functools import lru_cache
from operator import attrgetter

from protos.gpufleet.v1 import telemetry_pb2 as pb
from protos.names import clock_event_reason_names

_ACTIVE = attrgetter("active")
# An SM clock more than this share below max is "low" (as controller/detect/explain.py judges it).
CLOCK_LOW_MARGIN = 0.05
_NEAR_MAX = 1.0 - CLOCK_LOW_MARGIN
BUSY_UTILIZATION = 0.1  # below this, or with the gpu_idle reason set, a GPU is idle
_INPUTS = attrgetter(
    "clock_event_reasons",
    "gpu_utilization_ratio",  # unset reads 0.0: idle, as "not reported" is taken
    "max_sm_clock_hz",
    "sm_clock_hz",
    "applications_sm_clock_hz",
    "pcie_link_gen",
    "pcie_link_gen_max",  # unset reads 0: no gen is below it (an unreported max is no condition)
    "pcie_link_width",
    "pcie_link_width_max",
    "row_remap_pending",
    "row_remap_failure",
)


@lru_cache(maxsize=1024)
def _reasons(bits: int) -> tuple[frozenset[str], bool, bool]:
    """A reasons bitmask as (its names but gpu_idle, gpu_idle set, applications_clocks_setting set);
    a fleet shows a handful of masks."""
    names = frozenset(clock_event_reason_names(bits))
    return names - {"gpu_idle"}, "gpu_idle" in names, "applications_clocks_setting" in names


def conditions(sample: pb.GpuSample) -> set[str]:
    """Reason bits that are set (gpu_idle aside), plus derived states:

    - pcie_below_max: a link below its max gen or width, only while busy (idle links train down to
      save power);
    - nvlink_inactive: a link not active;
    - row_remap_pending: a remap pending or failed;
    - for a busy GPU whose SM clock is reported and well below max (CLOCK_LOW_MARGIN):
      "clocks_locked" when a setting holds it there (NVML's applications_clocks_setting reason, or
      an application clock below max), else "clock_low_no_reason" when no reason bit is set at all
      (reasons not reported, the field unset, are not "no reason"); a thermal or power reason
      explains the clock and adds neither. detect/clock_lock.py reads both.
    """
    bits, util, top, sm, app, gen, gen_max, width, width_max, pending, failure = _INPUTS(sample)
    reasons, idle, app_setting = _reasons(bits)
    found = set(reasons)
    if not idle and util >= BUSY_UTILIZATION:
        # `not >=`: a clock that is not a number is not near max (as the rule has always read it).
        if top and not sm >= _NEAR_MAX * top and sample.HasField("sm_clock_hz"):
            if app_setting or (app and app < _NEAR_MAX * top):
                found.add("clocks_locked")
            elif not reasons and sample.HasField("clock_event_reasons"):
                found.add("clock_low_no_reason")
        if gen < gen_max or width < width_max:
            found.add("pcie_below_max")
    if _links_down(sample):
        found.add("nvlink_inactive")
    if pending or failure:
        found.add("row_remap_pending")
    return found


def _links_down(sample: pb.GpuSample) -> bool:
    """Whether a link of the GPU is not active: as its agent counted them (nvlinks_inactive), else
    (an older agent's reading) each link's state read, in C: a GPU has up to 18 links."""
    if sample.HasField("nvlinks_inactive"):
        return sample.nvlinks_inactive > 0
    return not all(map(_ACTIVE, sample.nvlinks))


def update_held(previous: dict[str, float], sample: pb.GpuSample, at: float) -> dict[str, float]:
    """Since-times for the conditions of `sample` taken at `at`, continuing those already held."""
    return {name: min(previous.get(name, at), at) for name in conditions(sample)}
