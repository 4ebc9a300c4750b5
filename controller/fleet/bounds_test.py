"""A message type's whole screening verdict in one compiled test: whether every reading is within its
bounds and every part within its whole, from the values read in one call (plausible.py _screener).

The usual frame has nothing to clear, so this test is the whole of screening's work on most messages
after the read. Generic code paid about 70 ns a comparison on the development machine (operator.le
through map, 37 fields of a GPU twice: 5.3 us a GPU); a function written for the type compares each
value with its bounds as literals, where CPython's specialised float and int comparisons take a few
nanoseconds each.

The generated source holds only local names (v0, v1, ...) and number literals (repr of a finite
float, or an int): nothing from a message or a descriptor, so nothing a peer sends can reach it.
A float's bounds are finite (plausible._checks clamps them to the largest float), so NaN and the
infinities fail them, as they fail the generic test. An integer field's bounds are written as the
integers they admit (ceil of the low, floor of the high; an infinite side is left out): for an
integer value the same verdict, without comparing an int with a float.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

Test = Callable[[tuple[float, ...]], bool]


def bounds_test(
    size: int, bounds: Sequence[tuple[float, float, bool]], pairs: Sequence[tuple[int, int]] = ()
) -> Test:
    """test(values), for a tuple of `size` values: True when values[i] is within bounds[i] =
    (low, high, is a float) for each i, and values[part] <= values[whole] for each (part, whole)
    pair of positions (which may lie past the bounded ones)."""
    if len(bounds) > size or any(max(p, w) >= size for p, w in pairs):
        raise ValueError(f"a position past the {size} values")
    terms = [_term(f"v{i}", low, high, is_float) for i, (low, high, is_float) in enumerate(bounds)]
    terms += [f"v{part} <= v{whole}" for part, whole in pairs]
    terms = [t for t in terms if t]
    if not terms:
        return _always
    names = "".join(f"v{i}, " for i in range(size))
    source = f"def test(values):\n    {names}= values\n    return {' and '.join(terms)}\n"
    space: dict[str, object] = {}
    exec(compile(source, "<bounds_test>", "exec"), {"__builtins__": {}}, space)
    test: Test = space["test"]  # type: ignore[assignment]
    return test


def _term(name: str, low: float, high: float, is_float: bool) -> str:
    if is_float:
        if not (math.isfinite(low) and math.isfinite(high)):
            raise ValueError(f"a float's bounds must be finite (NaN must fail them): {low}, {high}")
        return f"{float(low)!r} <= {name} <= {float(high)!r}"
    sides = []
    if math.isfinite(low):
        sides.append(f"{math.ceil(low)} <= {name}")
    if math.isfinite(high):
        sides.append(f"{name} <= {math.floor(high)}")
    if len(sides) == 2:
        return f"{math.ceil(low)} <= {name} <= {math.floor(high)}"
    return sides[0] if sides else ""


def _always(values: tuple[float, ...]) -> bool:
    return True
