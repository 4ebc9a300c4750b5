"""Screening's shortcuts must clear, count and label exactly what looking at each value does:

- a long repeated field (a host's CPUs) is first tested a column at a time (every item's one field),
  and looked at item by item only when a column fails;
- the parts of a whole (memory used, free, reserved against the total) are read in one call, and
  their presence asked only when a part reads above its whole."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.fleet.plausible import BULK_ITEMS, screen
from protos.gpufleet.v1 import telemetry_pb2 as pb

# Fine, out of range either way, not a number, the largest finite (whose sum overflows), unset.
RATIOS = st.sampled_from([0.0, 0.5, 1.0, 1.01, 1.02, -0.01, math.nan, math.inf, -math.inf, 1e308, None])
HERTZ = st.sampled_from([0.0, 2.0e9, 9.9e9, 1.1e10, -1.0, math.nan, math.inf, 1.7e308, None])


@st.composite
def hosts(draw: st.DrawFn) -> pb.HostSample:
    host = pb.HostSample()
    count = draw(st.integers(0, 3 * BULK_ITEMS))
    fine = draw(st.booleans())  # most hosts report nothing out of range: the column test's case
    for number in range(count):
        cpu = host.cpus.add(cpu=number, governor="performance")
        ratio, hertz = (0.25, 2.0e9) if fine else (draw(RATIOS), draw(HERTZ))
        if ratio is not None:
            cpu.utilization_ratio = ratio
        if hertz is not None:
            cpu.frequency_hz = hertz
    odd = draw(HERTZ)
    if count and odd is not None and draw(st.booleans()):  # one value off among fine ones
        host.cpus[draw(st.integers(0, count - 1))].frequency_hz = odd
    return host


def each_alone(host: pb.HostSample) -> tuple[bytes, list[str], list[str]]:
    """The host's CPUs screened one by one, as a short list is."""
    copy = pb.HostSample()
    copy.CopyFrom(host)
    non_finite: list[str] = []
    labels: list[str] = []
    for cpu in copy.cpus:
        cleared, found = screen(cpu)
        non_finite += cleared
        labels += found
    return copy.SerializeToString(), non_finite, labels


@settings(max_examples=400, deadline=None)
@given(hosts())
def test_a_long_list_screened_by_columns_is_screened_as_each_item(host: pb.HostSample) -> None:
    expected = each_alone(host)
    non_finite, labels = screen(host)
    assert (host.SerializeToString(), non_finite, labels) == expected


def test_a_column_that_fails_is_looked_at_item_by_item() -> None:
    host = pb.HostSample()
    for number in range(4 * BULK_ITEMS):
        host.cpus.add(cpu=number, utilization_ratio=0.5, frequency_hz=2.0e9)
    host.cpus[5].utilization_ratio = math.nan
    host.cpus[9].frequency_hz = 2.0e10
    assert screen(host) == (["CpuCoreSample.utilization_ratio"], ["CpuCoreSample.frequency_hz"])
    assert not host.cpus[5].HasField("utilization_ratio") and not host.cpus[9].HasField("frequency_hz")
    assert host.cpus[4].utilization_ratio == 0.5 and host.cpus[9].utilization_ratio == 0.5


MEMORY = st.sampled_from([None, 0, 1, 79 << 30, 80 << 30, 81 << 30])


@settings(max_examples=300, deadline=None)
@given(st.fixed_dictionaries({name: MEMORY for name in ("total", "used", "free", "reserved")}))
def test_a_part_above_its_whole_is_cleared_only_when_both_are_set(memory: dict[str, Any]) -> None:
    fields = {f"memory_{name}_bytes": value for name, value in memory.items() if value is not None}
    sample = pb.GpuSample(index=0, **fields)
    total = memory["total"]
    above = [
        f"GpuSample.memory_{name}_bytes"
        for name in ("used", "free", "reserved")
        if total is not None and memory[name] is not None and memory[name] > total
    ]
    assert screen(sample) == ([], above)
    present = {f.name for f, _ in sample.ListFields()}
    for name in ("used", "free", "reserved"):
        cleared = f"GpuSample.memory_{name}_bytes" in above
        assert (f"memory_{name}_bytes" in present) == (memory[name] is not None and not cleared)


def test_a_value_not_a_number_among_fine_ones_is_cleared() -> None:
    """NaN compares false with everything, so a column's least and greatest can pass over it: the
    column's sum is what finds it."""
    for at in (0, 7, 3 * BULK_ITEMS - 1):
        host = pb.HostSample()
        for number in range(3 * BULK_ITEMS):
            host.cpus.add(cpu=number, utilization_ratio=0.5, frequency_hz=2.0e9)
        host.cpus[at].frequency_hz = math.nan
        assert screen(host) == (["CpuCoreSample.frequency_hz"], [])
        assert not host.cpus[at].HasField("frequency_hz")
        assert all(cpu.HasField("frequency_hz") for n, cpu in enumerate(host.cpus) if n != at)
