"""Agents connecting and leaving in the controller's log (controller/connection_log.py): a line each
up to a window's budget, then one exact count per window, written by a timer once the window ends,
or at shutdown."""

from __future__ import annotations

import asyncio
import logging

import pytest

from controller.connection_log import ConnectionLog

LOGGER = "gpufleet.test.connections"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_a_few_connections_are_logged_one_by_one(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    log = ConnectionLog(logging.getLogger(LOGGER), per_window=3, clock=Clock())
    log.connected("n1", "b1", "ipv4:127.0.0.1:5000", 7)
    log.disconnected("n1")
    log.close()
    assert lines(caplog) == [
        "agent connected: node n1 boot b1 (ipv4:127.0.0.1:5000), acked 7",
        "agent disconnected: node n1",
    ]


def test_a_storm_is_counted_past_the_budget_and_the_count_is_exact(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    clock = Clock()
    log = ConnectionLog(logging.getLogger(LOGGER), per_window=5, window_seconds=10.0, clock=clock)
    for i in range(120):
        log.disconnected(f"n{i}")
        log.connected(f"n{i}", "b2", "peer", 3)
    written = lines(caplog)
    assert len(written) == 10  # 5 of each kind
    assert written[:2] == ["agent disconnected: node n0", "agent connected: node n0 boot b2 (peer), acked 3"]
    clock.now += 9.9
    log.connected("late", "b2", "peer", 0)  # still the same window: counted
    assert len(lines(caplog)) == 10
    clock.now += 0.1
    log.connected("next", "b3", "peer", 0)  # a new window: the old one's counts first, then this line
    assert lines(caplog)[10:] == [
        "agents disconnected: 115 more in the last 10 s, not logged one by one; "
        "the last: agent disconnected: node n119",
        "agents connected: 116 more in the last 10 s, not logged one by one; "
        "the last: agent connected: node late boot b2 (peer), acked 0",
        "agent connected: node next boot b3 (peer), acked 0",
    ]


def test_the_count_is_written_when_the_window_ends_with_no_further_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, LOGGER)

    async def body() -> None:
        log = ConnectionLog(logging.getLogger(LOGGER), per_window=1, window_seconds=0.05)
        for i in range(4):
            log.connected(f"n{i}", "b", "peer", 0)
        assert len(lines(caplog)) == 1
        for _ in range(200):
            if len(lines(caplog)) == 2:
                break
            await asyncio.sleep(0.01)
        assert lines(caplog)[1].startswith("agents connected: 3 more in the last 0 s")

    asyncio.run(body())


def test_counts_held_at_shutdown_are_written(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    log = ConnectionLog(logging.getLogger(LOGGER), per_window=1, clock=Clock())
    log.disconnected("a")
    log.disconnected("b")
    log.disconnected("c")
    log.close()
    assert lines(caplog) == [
        "agent disconnected: node a",
        "agents disconnected: 2 more in the last 10 s, not logged one by one; "
        "the last: agent disconnected: node c",
    ]


def test_replaced_streams_are_warnings_and_so_is_their_count(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    log = ConnectionLog(logging.getLogger(LOGGER), per_window=2, clock=Clock())
    for i in range(5):
        log.replaced(f"n{i}", f"old{i}", f"new{i}")
    log.connected("n9", "b", "peer", 0)  # its own window and budget
    log.close()
    written = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER]
    assert written == [
        (logging.WARNING, "node n0: stream from old0 replaced by a newer one from new0"),
        (logging.WARNING, "node n1: stream from old1 replaced by a newer one from new1"),
        (logging.INFO, "agent connected: node n9 boot b (peer), acked 0"),
        (
            logging.WARNING,
            "streams replaced: 3 more in the last 10 s, not logged one by one; "
            "the last: node n4: stream from old4 replaced by a newer one from new4",
        ),
    ]
