"""The compiled bounds test (controller/fleet/bounds_test.py) gives the verdict of comparing each value
with its bounds one by one, as screening did before it: NaN and the infinities fail a float's
bounds, an integer is judged by the integers its bounds admit, and a part above its whole fails."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.fleet.bounds_test import bounds_test
from controller.fleet.plausible import screen
from protos.gpufleet.v1 import telemetry_pb2 as pb

FLOAT_MAX = 1.7976931348623157e308
FLOAT_BOUNDS = st.sampled_from(
    [(0.0, 1.01), (-40.0, 150.0), (0.0, 10e9), (-FLOAT_MAX, FLOAT_MAX), (0.0, FLOAT_MAX), (0.5, 0.5)]
)
INT_BOUNDS = st.sampled_from([(1, 7), (0.0, math.inf), (0.5, 6.5), (-3, 3), (2.0, 2.0)])
FLOATS = st.one_of(
    st.sampled_from([0.0, -0.0, 1.01, 1.0100000000000002, 150.0, -40.0, 10e9, FLOAT_MAX, 0.5]),
    st.sampled_from([math.nan, math.inf, -math.inf]),
    st.floats(allow_nan=True, allow_infinity=True),
)
INTS = st.one_of(st.integers(-10, 10), st.integers(0, 2**64 - 1), st.integers(-(2**63), 2**63))


@st.composite
def cases(
    draw: st.DrawFn,
) -> tuple[list[tuple[float, float, bool]], list[tuple[int, int]], tuple[float, ...]]:
    bounds: list[tuple[float, float, bool]] = []
    values: list[float] = []
    for _ in range(draw(st.integers(0, 12))):
        if draw(st.booleans()):
            low, high = draw(FLOAT_BOUNDS)
            bounds.append((low, high, True))
            values.append(draw(FLOATS))
        else:
            low, high = draw(INT_BOUNDS)
            bounds.append((low, high, False))
            values.append(draw(INTS))
    amounts = draw(st.lists(st.integers(0, 2**64 - 1), max_size=4))
    at = len(values)
    values += amounts
    pairs = []
    if len(amounts) >= 2:
        whole = at + len(amounts) - 1
        pairs = [(at + i, whole) for i in range(len(amounts) - 1)]
    return bounds, pairs, tuple(values)


def one_by_one(
    bounds: list[tuple[float, float, bool]], pairs: list[tuple[int, int]], values: tuple[float, ...]
) -> bool:
    return all(low <= value <= high for (low, high, _), value in zip(bounds, values, strict=False)) and all(
        values[part] <= values[whole] for part, whole in pairs
    )


@settings(max_examples=500, deadline=None)
@given(cases())
def test_the_compiled_test_agrees_with_comparing_each_value(
    case: tuple[list[tuple[float, float, bool]], list[tuple[int, int]], tuple[float, ...]],
) -> None:
    bounds, pairs, values = case
    assert bounds_test(len(values), bounds, pairs)(values) is one_by_one(bounds, pairs, values)


def test_not_a_number_and_the_infinities_fail_every_float_bound() -> None:
    test = bounds_test(2, [(-FLOAT_MAX, FLOAT_MAX, True), (0.0, 1.01, True)])
    assert test((1e308, 1.01))
    for bad in (math.nan, math.inf, -math.inf):
        assert not test((bad, 0.5))
        assert not test((0.0, bad))


def test_an_integer_is_judged_by_the_integers_its_bounds_admit() -> None:
    test = bounds_test(1, [(0.5, 6.5, False)])
    assert [test((n,)) for n in range(-1, 9)] == [
        False,
        False,
        True,
        True,
        True,
        True,
        True,
        True,
        False,
        False,
    ]
    unbounded_above = bounds_test(1, [(0.0, math.inf, False)])
    assert unbounded_above((2**64 - 1,)) and not unbounded_above((-1,))


def test_a_float_with_an_infinite_bound_or_a_position_past_the_values_is_refused() -> None:
    with pytest.raises(ValueError, match="finite"):
        bounds_test(1, [(0.0, math.inf, True)])
    with pytest.raises(ValueError, match="past the 2 values"):
        bounds_test(2, [], [(0, 2)])


def test_nothing_to_test_passes_anything() -> None:
    assert bounds_test(0, [])(())


def test_a_gpu_with_a_part_above_its_whole_and_every_reading_in_range_is_still_screened() -> None:
    """The parts of a whole are tested with the readings: a GPU fine but for its memory is not
    passed whole by the compiled test, and only the part is cleared."""
    sample = pb.GpuSample(
        index=0, temperature_celsius=60.0, memory_total_bytes=80 << 30, memory_reserved_bytes=81 << 30
    )
    assert screen(sample) == ([], ["GpuSample.memory_reserved_bytes"])
    assert sample.temperature_celsius == 60.0 and not sample.HasField("memory_reserved_bytes")
    assert sample.memory_total_bytes == 80 << 30
