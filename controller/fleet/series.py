"""A probe key's recent results: (time, value) pairs, oldest first, at most HISTORY_POINTS.

Kept as one array of doubles (t0, v0, t1, v1, ...): as a deque of (time, value) tuples a key at
HISTORY_POINTS held about 7 KB (three objects a point), so a node's 57 keys held 447 KB once a
probe round had run 64 times (32 hours at the default half-hour interval), more than all else the
controller holds of a node; in one array they hold 67 KB. The store keeps the same bytes
(probe_series.points, little-endian), so a controller's start reads each key's history in one row.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Iterator
from typing import Any, cast, overload

HISTORY_POINTS = 64  # results kept per probe key
_POINT_BYTES = 16  # a time and a value, each a double


class Series(array):  # type: ignore[type-arg]  # always "d"
    """The points themselves, in the array this is (not one it holds): the wrapper object was one
    more of the ~295 objects the collector tracks a node (57 a node, one a probe key), and ~95 bytes
    each (bench/results/2026-12-03_probe_records_memory.txt). As a sequence it is of points: len,
    iteration and indexing count (time, value) pairs, never the doubles the array holds."""

    __slots__ = ()

    def __new__(cls, points: Iterable[tuple[float, float]] = ()) -> Series:
        series = cast(Series, super().__new__(cls, "d"))
        for time, value in points:
            series.add(time, value)
        return series

    @classmethod
    def from_bytes(cls, data: bytes) -> Series:
        """The series to_bytes wrote; ValueError for bytes that are not whole points."""
        if len(data) % _POINT_BYTES:
            raise ValueError(f"a probe series of {len(data)} bytes is not whole (time, value) points")
        series = cls()
        series.frombytes(data)
        if sys.byteorder == "big":
            series.byteswap()
        extra = _doubles(series) - 2 * HISTORY_POINTS
        if extra > 0:  # kept longer elsewhere: the newest count
            del series[:extra]
        return series

    def to_bytes(self) -> bytes:
        """The points as little-endian doubles, the same on every machine that reads the store."""
        if sys.byteorder == "big":
            swapped = array("d", self.tobytes())
            swapped.byteswap()
            return swapped.tobytes()
        return self.tobytes()

    def add(self, time: float, value: float) -> None:
        """Add a result in its place by time (a replayed spool brings older ones), the newest
        HISTORY_POINTS kept; the same result twice in a row is kept once."""
        doubles = _doubles(self)
        if doubles and _double(self, -2) > time:
            points = sorted([*self, (time, value)])[-HISTORY_POINTS:]
            self[:] = array("d", [x for point in points for x in point])
            return
        if doubles and _double(self, -2) == time and _double(self, -1) == value:
            return
        self.append(time)
        self.append(value)
        if doubles + 2 > 2 * HISTORY_POINTS:
            del self[:2]

    def __iter__(self) -> Iterator[tuple[float, float]]:
        items = array.__iter__(self)
        return zip(items, items, strict=True)  # always whole points

    def __len__(self) -> int:
        return _doubles(self) // 2

    @overload  # type: ignore[override]
    def __getitem__(self, index: int) -> tuple[float, float]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[float, float]]: ...

    def __getitem__(self, index: int | slice) -> tuple[float, float] | list[tuple[float, float]]:
        if isinstance(index, slice):
            return list(self)[index]
        count = len(self)
        if not -count <= index < count:
            raise IndexError("probe series index out of range")
        at = 2 * (index % count)
        return _double(self, at), _double(self, at + 1)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Series) and array.__eq__(self, other) is True

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # mutable

    def __repr__(self) -> str:
        return f"Series({list(self)!r})"

    def __reduce_ex__(self, protocol: object) -> tuple[Any, ...]:  # array's own, not __reduce__
        return Series.from_bytes, (self.to_bytes(),)

    def __copy__(self) -> Series:
        return Series.from_bytes(self.to_bytes())

    def __deepcopy__(self, memo: object) -> Series:
        return self.__copy__()


_doubles = array.__len__  # the doubles held (Series.__len__ counts points)
_double = array.__getitem__  # one double by its index in the array
