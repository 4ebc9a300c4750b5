"""conditions() reads a GPU's inputs in one call and decodes each reasons mask once: it must name
exactly what the rules, read field by field, name, for any reading (set or unset fields, NaN, idle,
the lock and explaining reasons)."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.fleet.conditions import CLOCK_LOW_MARGIN, conditions
from protos.gpufleet.v1 import telemetry_pb2 as pb
from protos.names import clock_event_reason_bit, clock_event_reason_names

MAX = 1980e6


def rules(sample: pb.GpuSample) -> set[str]:
    """The conditions, each rule as its docstring says, reading every field on its own."""
    names = set(clock_event_reason_names(sample.clock_event_reasons))
    idle = "gpu_idle" in names
    names.discard("gpu_idle")
    util = sample.gpu_utilization_ratio if sample.HasField("gpu_utilization_ratio") else 0.0
    busy = not idle and util >= 0.1
    found = set(names)
    top = sample.max_sm_clock_hz
    low = top and sample.HasField("sm_clock_hz") and not sample.sm_clock_hz >= (1.0 - CLOCK_LOW_MARGIN) * top
    if busy and low:
        app = sample.applications_sm_clock_hz
        if "applications_clocks_setting" in names or (app and app < (1.0 - CLOCK_LOW_MARGIN) * top):
            found.add("clocks_locked")
        elif not names and sample.HasField("clock_event_reasons"):
            found.add("clock_low_no_reason")
    if busy and (
        (sample.HasField("pcie_link_gen_max") and sample.pcie_link_gen < sample.pcie_link_gen_max)
        or (sample.HasField("pcie_link_width_max") and sample.pcie_link_width < sample.pcie_link_width_max)
    ):
        found.add("pcie_below_max")
    if any(not link.active for link in sample.nvlinks):
        found.add("nvlink_inactive")
    if sample.row_remap_pending or sample.row_remap_failure:
        found.add("row_remap_pending")
    return found


BITS = [
    clock_event_reason_bit(name)
    for name in ("gpu_idle", "applications_clocks_setting", "hw_thermal_slowdown", "sw_power_cap")
] + [1 << 40]  # a bit the contract does not name
CLOCKS = st.sampled_from([0.0, 1400e6, 0.94 * MAX, 0.95 * MAX, 0.96 * MAX, MAX, math.nan])


def maybe(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | values  # None: the field left unset


@st.composite
def readings(draw: st.DrawFn) -> pb.GpuSample:
    fields: dict[str, Any] = {
        "clock_event_reasons": draw(maybe(st.sets(st.sampled_from(BITS)).map(sum))),
        "gpu_utilization_ratio": draw(maybe(st.sampled_from([0.0, 0.05, 0.1, 0.95, math.nan]))),
        "max_sm_clock_hz": draw(maybe(st.sampled_from([0.0, MAX]))),
        "sm_clock_hz": draw(maybe(CLOCKS)),
        "applications_sm_clock_hz": draw(maybe(CLOCKS)),
        "pcie_link_gen": draw(maybe(st.integers(0, 5))),
        "pcie_link_gen_max": draw(maybe(st.integers(0, 5))),
        "pcie_link_width": draw(maybe(st.sampled_from([0, 8, 16]))),
        "pcie_link_width_max": draw(maybe(st.sampled_from([0, 8, 16]))),
        "row_remap_pending": draw(maybe(st.booleans())),
        "row_remap_failure": draw(maybe(st.booleans())),
    }
    sample = pb.GpuSample(index=0, **{k: v for k, v in fields.items() if v is not None})
    states = draw(st.lists(st.booleans(), max_size=18))
    for number, active in enumerate(states):
        sample.nvlinks.add(link=number, active=active)
    counted = draw(st.booleans())
    if states and counted:  # as an agent counts them (agent/stream/frames.py)
        sample.nvlinks_inactive = states.count(False)
    return sample


@settings(max_examples=600, deadline=None)
@given(readings())
def test_conditions_name_what_the_rules_name(sample: pb.GpuSample) -> None:
    assert conditions(sample) == rules(sample)


def test_the_rules_see_each_condition() -> None:
    """The property above compares like with like: each derived condition is reachable."""
    busy: dict[str, Any] = {"gpu_utilization_ratio": 0.9, "max_sm_clock_hz": MAX, "sm_clock_hz": 1400e6}
    lock = clock_event_reason_bit("applications_clocks_setting")
    cases = [
        (pb.GpuSample(clock_event_reasons=lock, **busy), "clocks_locked"),
        (pb.GpuSample(clock_event_reasons=0, **busy), "clock_low_no_reason"),
        (pb.GpuSample(pcie_link_width=8, pcie_link_width_max=16, **busy), "pcie_below_max"),
        (pb.GpuSample(row_remap_failure=True), "row_remap_pending"),
        # A clock that is not a number is not near max (ingest clears NaN before asking).
        (pb.GpuSample(clock_event_reasons=0, **{**busy, "sm_clock_hz": math.nan}), "clock_low_no_reason"),
    ]
    for sample, name in cases:
        assert name in conditions(sample) and name in rules(sample)
    idle = pb.GpuSample(clock_event_reasons=clock_event_reason_bit("gpu_idle") | lock, **busy)
    assert conditions(idle) == rules(idle) == {"applications_clocks_setting"}


def test_a_link_down_is_read_from_the_agents_count_else_from_the_links() -> None:
    """An agent that counts the links not active (nvlinks_inactive) is taken at its count, without
    each link read; an older agent's reading (no count) is read link by link."""
    links = pb.GpuSample(index=0)
    for number in range(18):
        links.nvlinks.add(link=number, active=number != 5)
    assert "nvlink_inactive" in conditions(links)  # no count: the links read
    counted = pb.GpuSample()
    counted.CopyFrom(links)
    counted.nvlinks_inactive = 0  # the count wins: the links are not read
    assert "nvlink_inactive" not in conditions(counted)
    counted.nvlinks_inactive = 1
    counted.nvlinks[5].active = True
    assert "nvlink_inactive" in conditions(counted)
    assert "nvlink_inactive" not in conditions(pb.GpuSample(index=0, nvlinks_inactive=0))
