"""The stream's families on the agent's page (agent/exporter/stream_families.py): read at each scrape
(not kept with the snapshot's page), written as prometheus_client writes them, and absent when the
agent does not stream."""

from __future__ import annotations

import dataclasses

from prometheus_client.exposition import generate_latest

from agent.exporter.stream_families import NAMES
from agent.stream.status import StreamStatus
from tests.agent.exporter.simnode import build

STATUS = StreamStatus(
    controller="ctl.example:50051",
    connected=True,
    last_ack_time=1_796_000_000.25,
    spooled=3,
    max_frames=8640,
    on_disk=True,
    dropped=0,
    rejected=1,
)


def series(page: bytes) -> dict[str, str]:
    """Every stream series on `page`: name -> the rest of its line (labels and value)."""
    out = {}
    for line in page.decode().splitlines():
        name = line.split("{", 1)[0]
        if name in NAMES:
            out[name] = line[len(name) :]
    return out


def test_the_page_shows_the_stream_as_it_is_at_each_scrape() -> None:
    sim = build(node="n1", seed=1)
    try:
        sim.sample()
        status = STATUS
        sim.exporter.stream_status = lambda: status
        first = series(sim.exporter.render())
        assert first == {
            "gpufleet_agent_controller_connected": '{controller="ctl.example:50051",node="n1"} 1.0',
            "gpufleet_agent_controller_last_ack_timestamp_seconds": '{node="n1"} 1.79600000025e+09',
            "gpufleet_agent_spool_frames": '{node="n1"} 3.0',
            "gpufleet_agent_spool_max_frames": '{node="n1"} 8640.0',
            "gpufleet_agent_spool_on_disk": '{node="n1"} 1.0',
            "gpufleet_agent_spool_dropped_frames_total": '{node="n1"} 0.0',
            "gpufleet_agent_spool_rejected_frames_total": '{node="n1"} 1.0',
        }
        # The controller went away and the disk filled, with no new snapshot: the next scrape says so.
        status = dataclasses.replace(STATUS, connected=False, spooled=9, on_disk=False, dropped=2)
        second = series(sim.exporter.render())
        assert second["gpufleet_agent_controller_connected"].endswith(" 0.0")
        assert second["gpufleet_agent_spool_frames"] == '{node="n1"} 9.0'
        assert second["gpufleet_agent_spool_on_disk"] == '{node="n1"} 0.0'
        assert second["gpufleet_agent_spool_dropped_frames_total"] == '{node="n1"} 2.0'
    finally:
        sim.close()


def test_what_is_not_known_has_no_series() -> None:
    sim = build(node="n1", seed=1)
    try:
        sim.sample()
        sim.exporter.stream_status = lambda: dataclasses.replace(STATUS, last_ack_time=None, on_disk=None)
        shown = series(sim.exporter.render())
        assert "gpufleet_agent_controller_last_ack_timestamp_seconds" not in shown  # no ack yet
        assert "gpufleet_agent_spool_on_disk" not in shown  # no spool directory: memory by design
        assert "gpufleet_agent_spool_frames" in shown
    finally:
        sim.close()


def test_an_agent_that_does_not_stream_shows_none_of_them() -> None:
    sim = build(node="n1", seed=1)
    try:
        sim.sample()
        assert series(sim.exporter.render()) == {}  # not set: the --once, or a page with no agent
        sim.exporter.stream_status = lambda: None  # an agent with no controller configured
        assert series(sim.exporter.render()) == {}
    finally:
        sim.close()


def test_the_written_page_is_what_prometheus_client_writes_of_the_registry() -> None:
    sim = build(node='rack "7"\\slot\nb', seed=3)
    try:
        sim.sample()
        sim.exporter.stream_status = lambda: dataclasses.replace(STATUS, controller='a"b\\c')
        ours = sim.exporter.render()
        assert ours == generate_latest(sim.exporter.registry)
        assert b'controller="a\\"b\\\\c"' in ours
    finally:
        sim.close()
