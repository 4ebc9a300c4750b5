"""A GPU's NVLink counters in Trends: an unchanged reading is found in one comparison (issue 17), and
that shortcut must never hide a change: a counter that rose, a link that came or went, a renumbered
link, a reset, an older reading."""

from __future__ import annotations

import pickle

from controller.fleet.trends import Trends, nvlink_group, nvlink_key
from protos.gpufleet.v1 import telemetry_pb2 as pb

T0 = 1_800_000_000.0


def sample(links: dict[int, tuple[int, int, int]], tx: int = 0) -> pb.GpuSample:
    """GPU 3 with these links' (crc, replay, recovery) totals; tx changes every reading, as it does."""
    return pb.GpuSample(
        index=3,
        nvlinks=[
            pb.NvLinkSample(
                link=n,
                active=True,
                crc_errors_total=crc,
                replay_errors_total=replay,
                recovery_errors_total=recovery,
                tx_bytes_total=tx + n,
            )
            for n, (crc, replay, recovery) in links.items()
        ],
    )


QUIET = {n: (5, 0, 1) for n in range(18)}


def test_a_quiet_gpu_keeps_one_point_while_its_window_moves() -> None:
    trends = Trends()
    for k in range(10):
        trends.observe_gpu(sample(QUIET, tx=k * 1000), T0 + 10 * k)
    group = trends.groups[nvlink_group(3)]
    assert list(group.points) == [(T0, tuple(v for n in range(18) for v in QUIET[n]))]
    assert group.last == T0 + 90
    assert not trends.changed(nvlink_group(3))
    assert trends.span(nvlink_key(3, 7, "crc_errors_total")) == 90
    assert trends.increase(nvlink_key(3, 7, "crc_errors_total")) == 0


def test_one_counter_rising_on_one_link_is_seen() -> None:
    trends = Trends()
    trends.observe_gpu(sample(QUIET), T0)
    trends.observe_gpu(sample(QUIET, tx=1), T0 + 10)
    rising = dict(QUIET)
    rising[11] = (5, 4, 1)  # replay errors on link 11
    trends.observe_gpu(sample(rising, tx=2), T0 + 20)
    trends.observe_gpu(sample(rising, tx=3), T0 + 30)
    assert trends.changed(nvlink_group(3))
    assert trends.increase(nvlink_key(3, 11, "replay_errors_total")) == 4
    assert trends.rate(nvlink_key(3, 11, "replay_errors_total")) == 4 / 30
    assert trends.increase(nvlink_key(3, 10, "replay_errors_total")) == 0
    assert trends.increase(nvlink_key(3, 11, "crc_errors_total")) == 0


def test_renumbered_links_with_the_same_totals_are_new_counters() -> None:
    trends = Trends()
    trends.observe_gpu(sample(QUIET), T0)
    renumbered = {n + 1: totals for n, totals in QUIET.items()}  # links 1..18, same totals
    trends.observe_gpu(sample(renumbered), T0 + 10)
    assert trends.found(nvlink_key(3, 18, "crc_errors_total")) == (nvlink_group(3), 17 * 3)
    assert trends.found(nvlink_key(3, 0, "crc_errors_total")) is None
    assert trends.span(nvlink_key(3, 18, "crc_errors_total")) == 0  # a new series: no history yet


def test_a_link_gone_changes_the_group() -> None:
    trends = Trends()
    trends.observe_gpu(sample(QUIET), T0)
    fewer = {n: t for n, t in QUIET.items() if n != 17}
    trends.observe_gpu(sample(fewer), T0 + 10)
    assert trends.found(nvlink_key(3, 17, "crc_errors_total")) is None
    assert trends.found(nvlink_key(3, 16, "crc_errors_total")) == (nvlink_group(3), 16 * 3)
    assert len(trends.groups[nvlink_group(3)].names) == 17 * 3


def test_a_reset_starts_the_window_over_and_an_older_reading_is_ignored() -> None:
    trends = Trends()
    trends.observe_gpu(sample(QUIET), T0)
    reset = {n: (0, 0, 0) for n in range(18)}
    trends.observe_gpu(sample(reset), T0 + 10)
    assert list(trends.groups[nvlink_group(3)].points) == [(T0 + 10, (0,) * 54)]
    trends.observe_gpu(sample(QUIET), T0 + 5)  # older than the newest: the window is past it
    assert list(trends.groups[nvlink_group(3)].points) == [(T0 + 10, (0,) * 54)]
    # The ignored reading is not taken as the newest: the same totals, now newer, are a rise.
    trends.observe_gpu(sample(QUIET), T0 + 20)
    assert trends.groups[nvlink_group(3)].last == T0 + 20
    assert trends.changed(nvlink_group(3))
    assert trends.increase(nvlink_key(3, 0, "crc_errors_total")) == 5


def test_a_pickled_copy_leaves_out_what_it_can_rebuild_and_goes_on_as_the_original() -> None:
    """A detection process's copy of the fleet pickles each node's trends: the counter index
    (`where`) is rebuilt from the groups when first asked, and a group's last link reading (`seen`, a
    cache) is left out. The copy answers as the original, and goes on as it does: an unchanged
    reading moves the window, a changed one is seen."""
    trends = Trends()
    trends.observe_gpu(sample(QUIET), T0)
    rising = dict(QUIET)
    rising[11] = (5, 4, 1)
    trends.observe_gpu(sample(rising, tx=1), T0 + 10)
    trends.observe("ib.mlx5_0/1.symbol_error_total", T0 + 10, 3.0)
    trends.found("")  # the original's index built
    copy = pickle.loads(pickle.dumps(trends))
    assert copy == trends and copy.where is None
    copy.found("")
    assert trends.where is not None and len(trends.where) == 18 * 3 + 2 + 1
    assert copy.where == trends.where
    assert copy.groups[nvlink_group(3)].seen is None and trends.groups[nvlink_group(3)].seen is not None
    whole = pickle.dumps((trends.window_seconds, trends.groups, trends.where, trends.xids))
    assert len(pickle.dumps(trends)) < 0.9 * len(whole)  # (the names are pickled once either way)
    for both in (trends, copy):
        both.observe_gpu(sample(rising, tx=2), T0 + 20)  # unchanged: the window moves
    assert copy == trends and copy.groups[nvlink_group(3)].seen == trends.groups[nvlink_group(3)].seen
    rising[2] = (6, 0, 1)
    for both in (trends, copy):
        both.observe_gpu(sample(rising, tx=3), T0 + 30)
    assert copy == trends
    assert copy.increase(nvlink_key(3, 2, "crc_errors_total")) == 1
    assert copy.rate(nvlink_key(3, 11, "replay_errors_total")) == trends.rate(
        nvlink_key(3, 11, "replay_errors_total")
    )


def digested(links: dict[int, tuple[int, int, int]], digest: int, tx: int = 0) -> pb.GpuSample:
    """sample() as an agent that sends the digest of its links' error totals does."""
    gpu = sample(links, tx)
    if digest:  # 0: not sent, as an older agent
        gpu.nvlink_errors_digest = digest
    return gpu


def test_with_the_agents_digest_the_links_are_read_only_when_it_changes() -> None:
    """The digest stands for the links' error totals (agent/stream/frames.py), so the same digest is
    the same reading, whatever the links' messages say: they are not read."""
    trends = Trends()
    trends.observe_gpu(digested(QUIET, 11), T0)
    trends.observe_gpu(digested(QUIET, 11, tx=1), T0 + 10)
    rising = dict(QUIET)
    rising[4] = (9, 0, 1)
    trends.observe_gpu(digested(rising, 11, tx=2), T0 + 20)  # not read: the digest says unchanged
    group = trends.groups[nvlink_group(3)]
    assert group.last == T0 + 20 and len(group.points) == 1 and group.seen == 11
    trends.observe_gpu(digested(rising, 12, tx=3), T0 + 30)  # a new digest: read, and the rise seen
    assert trends.increase(nvlink_key(3, 4, "crc_errors_total")) == 4
    assert trends.span(nvlink_key(3, 4, "crc_errors_total")) == 30
    trends.observe_gpu(digested(rising, 12, tx=4), T0 + 25)  # older: ignored, the window stays
    assert trends.groups[nvlink_group(3)].last == T0 + 30


def test_an_agent_that_stops_or_starts_sending_the_digest_is_read_as_it_sends() -> None:
    trends, reference = Trends(), Trends()
    rising = dict(QUIET)
    rising[9] = (5, 2, 1)
    steps = [(QUIET, 7), (QUIET, 0), (QUIET, 7), (rising, 0), (rising, 8), (rising, 8), (QUIET, 9)]
    for k, (links, digest) in enumerate(steps):
        trends.observe_gpu(digested(links, digest, tx=k), T0 + 10 * k)
        reference.observe_gpu(sample(links, tx=k), T0 + 10 * k)  # read every time
        assert trends == reference, k
    assert trends.groups[nvlink_group(3)].seen == 9  # kept as sent, for the next reading
    copy = pickle.loads(pickle.dumps(trends))  # a detection process's copy: without it
    assert copy.groups[nvlink_group(3)].seen is None
    for both in (trends, copy):  # the copy reads the links, finds them the newest, and keeps it
        both.observe_gpu(digested(QUIET, 9, tx=99), T0 + 100)
    assert copy.groups[nvlink_group(3)].seen == 9 and copy == trends


def test_the_counters_places_are_worked_out_at_the_first_look_up_and_kept_up_to_date() -> None:
    """Trends.where (counter -> its group and place) is built only once a counter is looked up: most
    nodes' never are. From then on each new or renumbered group updates it, as building it again
    from the groups would give; a copy (pickled) builds it again when asked."""
    trends = Trends()
    trends.observe_gpu(sample(QUIET), T0)
    trends.observe_gpu(sample(QUIET), T0 + 10)
    assert trends.where is None
    assert trends.increase(nvlink_key(3, 5, "crc_errors_total")) == 0
    assert trends.where is not None
    renumbered = {n + 1: totals for n, totals in QUIET.items()}
    trends.observe_gpu(sample(renumbered), T0 + 20)  # links 1..18 now: a new group of names
    trends.observe("gpu9.other_total", T0 + 20, 1.0)  # a group of its own
    built = dict(trends.where)
    trends.where = None
    trends.found("")  # built again from the groups alone
    assert built == trends.where
    assert trends.found(nvlink_key(3, 0, "crc_errors_total")) is None
    assert trends.found("gpu9.other_total") == ("gpu9.other_total", 0)
    copy = pickle.loads(pickle.dumps(trends))
    assert copy.where is None and copy.found(nvlink_key(3, 18, "replay_errors_total")) == (
        nvlink_group(3),
        17 * 3 + 1,
    )
