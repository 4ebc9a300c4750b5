"""GpuSample.nvlink_errors_digest: the agent's digest of a GPU's NVLink error totals, which lets the
controller skip reading 18 links a GPU while they stay put. It must change with any link's error
total, number or presence, and not with what the controller does not count (traffic, state)."""

from __future__ import annotations

import dataclasses

from agent.snapshot import Snapshot
from agent.sources.gpu import GpuReading, NvLinkReading
from agent.stream import frames

LINKS = [NvLinkReading(link=n, active=True, crc_errors_total=3, replay_errors_total=0) for n in range(18)]


def digest(links: list[NvLinkReading]) -> int:
    return frames.nvlink_errors_digest(links)


def test_it_changes_with_any_error_total_or_link_and_not_with_traffic() -> None:
    base = digest(LINKS)
    assert base != 0 and digest(list(LINKS)) == base
    for n in (0, 7, 17):
        for name in ("crc_errors_total", "replay_errors_total", "recovery_errors_total"):
            changed = list(LINKS)
            changed[n] = dataclasses.replace(LINKS[n])
            setattr(changed[n], name, (getattr(LINKS[n], name) or 0) + 1)
            assert digest(changed) != base, (n, name)
    assert digest(LINKS[:-1]) != base  # a link gone
    assert digest([dataclasses.replace(link, link=link.link + 1) for link in LINKS]) != base  # renumbered
    moved = [
        dataclasses.replace(link, tx_bytes_total=10**15, rx_bytes_total=5, active=False) for link in LINKS
    ]
    assert digest(moved) == base  # traffic and link state: not error totals
    # An unread total reads as 0, as the controller reads an unset one.
    assert digest([dataclasses.replace(LINKS[0], recovery_errors_total=0), *LINKS[1:]]) == base


def test_a_frame_carries_it_for_gpus_with_links_only() -> None:
    with_links = GpuReading(index=0, uuid="GPU-0", nvlinks=list(LINKS))
    without = GpuReading(index=1, uuid="GPU-1")
    frame = frames.frame(Snapshot(node="n1", time=1_800_000_000.0, gpus=[with_links, without]), "b1", 1)
    assert frame.gpus[0].nvlink_errors_digest == digest(LINKS)
    assert not frame.gpus[1].HasField("nvlink_errors_digest")  # not sent


def test_a_frame_counts_the_links_not_active_for_gpus_with_links_only() -> None:
    """GpuSample.nvlinks_inactive: the controller reads it instead of each link's state."""
    down = [dataclasses.replace(link, active=link.link not in (3, 11)) for link in LINKS]
    gpus = [
        GpuReading(index=0, uuid="GPU-0", nvlinks=list(LINKS)),
        GpuReading(index=1, uuid="GPU-1", nvlinks=down),
        GpuReading(index=2, uuid="GPU-2"),
    ]
    frame = frames.frame(Snapshot(node="n1", time=1_800_000_000.0, gpus=gpus), "b1", 1)
    assert frame.gpus[0].HasField("nvlinks_inactive") and frame.gpus[0].nvlinks_inactive == 0
    assert frame.gpus[1].nvlinks_inactive == 2
    assert not frame.gpus[2].HasField("nvlinks_inactive")  # no links: not sent
