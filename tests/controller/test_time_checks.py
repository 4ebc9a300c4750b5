"""ingest_checks.first_bad_time on every kind of time a frame holds, each out of range in each way:
the check worked out per message type (every frame and Hello asks it) must refuse what the walk
naming the field refuses, and take what it takes, at the edges too."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from controller.ingest_checks import EARLIEST, first_bad_time
from protos.gpufleet.v1 import telemetry_pb2 as pb

NOW = 1_800_000_000.0
SKEW = 300.0
LATEST = NOW + SKEW


def frame() -> pb.TelemetryFrame:
    """A frame with a time in every place one can be: its own, a GPU's and a probe's XID events, a
    probe's, the BMC poll's."""
    f = pb.TelemetryFrame(node="n1", boot_id="b1", seq=1)
    f.time.seconds = int(NOW)
    for index in range(2):
        f.gpus.add(index=index).xid_events.add(code=79, unix_time_seconds=NOW - 5)
    probe = f.probes.add(value=1.0)
    probe.time.seconds = int(NOW - 1)
    probe.during.xid_events.add(code=13, unix_time_seconds=NOW - 2)
    f.bmc.time.seconds = int(NOW - 3)
    return f


def stamp(path: Callable[[pb.TelemetryFrame], object]) -> Callable[[pb.TelemetryFrame, float, int], None]:
    def set_(f: pb.TelemetryFrame, seconds: float, nanos: int) -> None:
        ts = path(f)
        ts.seconds, ts.nanos = int(seconds), nanos  # type: ignore[attr-defined]

    return set_


def xid(path: Callable[[pb.TelemetryFrame], pb.XidEvent]) -> Callable[[pb.TelemetryFrame, float, int], None]:
    def set_(f: pb.TelemetryFrame, seconds: float, nanos: int) -> None:
        path(f).unix_time_seconds = seconds + nanos / 1e9

    return set_


PLACES: dict[str, Callable[[pb.TelemetryFrame, float, int], None]] = {
    "time": stamp(lambda f: f.time),
    "gpus[1].xid_events[0].unix_time_seconds": xid(lambda f: f.gpus[1].xid_events[0]),
    "probes[0].time": stamp(lambda f: f.probes[0].time),
    "probes[0].during.xid_events[0].unix_time_seconds": xid(lambda f: f.probes[0].during.xid_events[0]),
    "bmc.time": stamp(lambda f: f.bmc.time),
}
STAMPS = [place for place in PLACES if "xid" not in place]
XIDS = [place for place in PLACES if "xid" in place]


def test_a_frame_of_times_in_range_passes_at_both_edges() -> None:
    assert first_bad_time(frame(), NOW, SKEW) is None
    for place, set_ in PLACES.items():
        for seconds in (EARLIEST, LATEST):
            f = frame()
            set_(f, seconds, 0)
            assert first_bad_time(f, NOW, SKEW) is None, (place, seconds)


@pytest.mark.parametrize("place", list(PLACES))
@pytest.mark.parametrize(
    ("seconds", "nanos", "why"),
    [
        (EARLIEST - 1, 0, "is before 2000-01-01"),
        (0, 0, "is before 2000-01-01"),
        (LATEST + 1, 0, "s ahead of the controller's clock"),
        (LATEST, 500_000_000, "s ahead of the controller's clock"),  # past the latest by its nanos
    ],
)
def test_a_time_out_of_range_anywhere_is_named(place: str, seconds: float, nanos: int, why: str) -> None:
    f = frame()
    PLACES[place](f, seconds, nanos)
    problem = first_bad_time(f, NOW, SKEW)
    assert problem is not None and problem.startswith(f"{place} ") and why in problem


@pytest.mark.parametrize("place", STAMPS)
@pytest.mark.parametrize("nanos", [-1, 1_000_000_000])
def test_a_timestamp_with_nanos_out_of_range_is_named(place: str, nanos: int) -> None:
    f = frame()
    PLACES[place](f, NOW, nanos)
    assert first_bad_time(f, NOW, SKEW) == f"{place} has nanos {nanos} (0..999999999)"


@pytest.mark.parametrize("place", XIDS)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_an_xid_time_not_finite_is_named(place: str, value: float) -> None:
    f = frame()
    PLACES[place](f, value, 0)
    problem = first_bad_time(f, NOW, SKEW)
    assert problem is not None and problem.startswith(f"{place} is ")


def test_a_hello_start_time_is_checked_the_same_way() -> None:
    hello = pb.Hello(node="n1", boot_id="b1")
    assert first_bad_time(hello, NOW, SKEW) is None  # unset: no time to check
    hello.started_at.seconds = EARLIEST - 1
    assert first_bad_time(hello, NOW, SKEW) == "started_at is before 2000-01-01 (unix 946684799)"
    hello.started_at.seconds = int(NOW)
    assert first_bad_time(hello, NOW, SKEW) is None
