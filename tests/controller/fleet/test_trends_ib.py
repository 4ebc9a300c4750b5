"""A host's InfiniBand counters in Trends: a reading of the ports equal to the one taken last only
moves the window (issue 17: about half of observe_host's time), and that shortcut must leave every
group as reading each port on its own leaves it, whatever comes: a rise, a reset, an older reading,
a port listed twice, a port gone or added, a pickled copy; with the ports' digest its agent sends
(HostSample.infiniband_digest) or without it (an older agent's)."""

from __future__ import annotations

import pickle

import pytest

from controller.fleet.trends import IB_COUNTERS, Trends, ib_group, ib_key
from protos.gpufleet.v1 import telemetry_pb2 as pb

T0 = 1_800_000_000.0
Ports = dict[tuple[str, int], tuple[int, int, int, int]]


def host(
    ports: Ports | list[tuple[tuple[str, int], tuple[int, int, int, int]]], *, digest: bool = False
) -> pb.HostSample:
    """With `digest`, the ports' digest as an agent sends it: any value that changes with them."""
    items = list(ports.items()) if isinstance(ports, dict) else ports
    sample = pb.HostSample()
    for n, ((device, number), totals) in enumerate(items):
        port = sample.infiniband.add(device=device, port=number, state="active")
        for name, total in zip(IB_COUNTERS, totals, strict=True):
            setattr(port, name, total)
        port.port_xmit_data_bytes_total = 1000 * n  # traffic: read by no counter group
    if digest and items:
        sample.infiniband_digest = hash(tuple(map(repr, items))) % 2**63 or 1
    return sample


def each_port(trends: Trends, sample: pb.HostSample, time: float) -> None:
    """The reference: every port observed on its own, as before the shortcut."""
    for port in sample.infiniband:
        totals = tuple(float(getattr(port, name)) for name in IB_COUNTERS)
        names = tuple(ib_key(port.device, port.port, name) for name in IB_COUNTERS)
        trends.observe_group(ib_group(port.device, port.port), names, time, totals)


def state(trends: Trends) -> dict[str, tuple[object, ...]]:
    return {name: (list(g.points), g.last, g.names) for name, g in trends.groups.items()}


QUIET: Ports = {(f"mlx5_{d}", 1): (0, 2, 0, 1) for d in range(8)}


@pytest.mark.parametrize("digest", [False, True], ids=["read", "digest"])
def test_the_shortcut_leaves_every_group_as_reading_each_port_does(digest: bool) -> None:
    rising = dict(QUIET) | {("mlx5_3", 1): (0, 9, 0, 1)}
    reset = {key: (0, 0, 0, 0) for key in QUIET}
    fewer = {key: totals for key, totals in QUIET.items() if key != ("mlx5_7", 1)}
    more = dict(QUIET) | {("mlx5_8", 1): (0, 0, 0, 0)}
    twice = [*QUIET.items(), (("mlx5_0", 1), (1, 2, 0, 1))]  # mlx5_0/1 listed twice, differing
    steps: list[tuple[float, pb.HostSample]] = [
        (T0, host(QUIET, digest=digest)),
        (T0 + 10, host(QUIET, digest=digest)),
        (T0 + 20, host(QUIET, digest=digest)),
        (T0 + 30, host(rising, digest=digest)),
        (T0 + 40, host(rising, digest=digest)),
        (T0 + 38, host(rising, digest=digest)),  # the same reading, older: the window does not go back
        (T0 + 35, host(QUIET, digest=digest)),  # older than the newest: ignored, and not taken as the newest
        (T0 + 50, host(QUIET, digest=digest)),  # the same totals as the ignored one, now newer: a reset
        (T0 + 60, host(reset, digest=digest)),
        (T0 + 70, host(reset, digest=digest)),
        (T0 + 80, host(twice, digest=digest)),
        (
            T0 + 90,
            host(twice, digest=digest),
        ),  # the same reading again: its port listed twice reads as before
        (T0 + 100, host(fewer, digest=digest)),
        (T0 + 110, host(more, digest=digest)),
        (T0 + 120, host(more, digest=digest)),
        (T0 + 700, host(more, digest=digest)),  # the window moves past every change
        (T0 + 710, host(more, digest=digest)),
        (T0 + 720, host({}, digest=digest)),
    ]
    trends, reference = Trends(), Trends()
    for time, sample in steps:
        trends.observe_host(sample, time)
        each_port(reference, sample, time)
        assert state(trends) == state(reference), time
        for name in {n for g in reference.groups.values() for n in g.names}:
            assert trends.found(name) == reference.found(name), (time, name)


def test_an_unchanged_reading_moves_the_window_and_a_rise_is_still_seen() -> None:
    trends = Trends()
    for k in range(5):
        trends.observe_host(host(QUIET), T0 + 10 * k)
    group = trends.groups[ib_group("mlx5_2", 1)]
    assert trends.ib_seen is not None and group.last == T0 + 40 and len(group.points) == 1
    trends.observe_host(host(dict(QUIET) | {("mlx5_2", 1): (0, 2, 5, 1)}), T0 + 50)
    assert trends.changed(ib_group("mlx5_2", 1)) and not trends.changed(ib_group("mlx5_1", 1))
    assert trends.increase(ib_key("mlx5_2", 1, "port_rcv_errors_total")) == 5


def test_a_pickled_copy_goes_on_as_the_original_without_the_cache() -> None:
    trends = Trends()
    trends.observe_host(host(QUIET), T0)
    trends.observe_host(host(QUIET), T0 + 10)
    copy = pickle.loads(pickle.dumps(trends))
    assert copy.ib_seen is None and trends.ib_seen is not None and copy == trends
    rising = dict(QUIET) | {("mlx5_5", 1): (1, 2, 0, 1)}
    for time, ports in ((T0 + 20, QUIET), (T0 + 30, rising), (T0 + 40, rising)):
        for both in (trends, copy):
            both.observe_host(host(ports), time)
        assert state(copy) == state(trends)
    assert copy.increase(ib_key("mlx5_5", 1, "link_downed_total")) == 1


def test_an_unchanged_digest_is_taken_for_an_unchanged_reading_and_a_changed_one_is_read() -> None:
    trends = Trends()
    trends.observe_host(host(QUIET, digest=True), T0)
    # The agent says its ports read as before: they are not read (what they hold is not looked at).
    same = host(dict(QUIET) | {("mlx5_2", 1): (0, 2, 7, 1)})
    same.infiniband_digest = host(QUIET, digest=True).infiniband_digest
    trends.observe_host(same, T0 + 10)
    assert trends.increase(ib_key("mlx5_2", 1, "port_rcv_errors_total")) == 0
    assert trends.groups[ib_group("mlx5_2", 1)].last == T0 + 10  # the window moved
    rising = dict(QUIET) | {("mlx5_2", 1): (0, 2, 7, 1)}
    trends.observe_host(host(rising, digest=True), T0 + 20)
    assert trends.increase(ib_key("mlx5_2", 1, "port_rcv_errors_total")) == 7
    trends.observe_host(host(dict(QUIET) | {("mlx5_2", 1): (0, 2, 9, 1)}), T0 + 30)  # no digest: read
    assert trends.increase(ib_key("mlx5_2", 1, "port_rcv_errors_total")) == 9
