"""A probe key's recent results: (time, value) pairs, oldest first, at most HISTORY_POINTS.

Kept in one array of doubles (t0, v0, t1, v1, ...): as a deque of (time, value) tuples a key at
HISTORY_POINTS held about 7 KB (three objects a point), so a node's 57 keys held 447 KB once a
probe round had run 64 times (32 hours at the default half-hour interval), more than all else the
controller holds of a node; in one array they hold 67 KB. The store keeps the same bytes
(probe_series.points, little-endian), so a controller's start reads each key's history in one row.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Iterator
from typing import Any, overload

HISTORY_POINTS = 64  # results kept per probe key
_POINT_BYTES = 16  # a time and a value, each a double


class Series:
    __slots__ = ("_data",)

    def __init__(self, points: Iterable[tuple[float, float]] = ()) -> None:
        self._data = array("d")
        for time, value in points:
            self.add(time, value)

    @classmethod
    def from_bytes(cls, data: bytes) -> Series:
        """The series to_bytes wrote; ValueError for bytes that are not whole points."""
        if len(data) % _POINT_BYTES:
            raise ValueError(f"a probe series of {len(data)} bytes is not whole (time, value) points")
        series = cls.__new__(cls)
        series._data = array("d")
        series._data.frombytes(data)
        if sys.byteorder == "big":
            series._data.byteswap()
        if len(series._data) > 2 * HISTORY_POINTS:  # kept longer elsewhere: the newest count
            del series._data[: len(series._data) - 2 * HISTORY_POINTS]
        return series

    def to_bytes(self) -> bytes:
        """The points as little-endian doubles, the same on every machine that reads the store."""
        if sys.byteorder == "big":
            swapped = array("d", self._data)
            swapped.byteswap()
            return swapped.tobytes()
        return self._data.tobytes()

    def add(self, time: float, value: float) -> None:
        """Add a result in its place by time (a replayed spool brings older ones), the newest
        HISTORY_POINTS kept; the same result twice in a row is kept once."""
        data = self._data
        if data and data[-2] > time:
            points = sorted([*self, (time, value)])[-HISTORY_POINTS:]
            self._data = array("d", [x for point in points for x in point])
            return
        if data and data[-2] == time and data[-1] == value:
            return
        data.append(time)
        data.append(value)
        if len(data) > 2 * HISTORY_POINTS:
            del data[:2]

    def __iter__(self) -> Iterator[tuple[float, float]]:
        items = iter(self._data)
        return zip(items, items, strict=True)  # always whole points

    def __len__(self) -> int:
        return len(self._data) // 2

    @overload
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
        return self._data[at], self._data[at + 1]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Series) and self._data == other._data

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"Series({list(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return Series.from_bytes, (self.to_bytes(),)
