"""The demo's --seconds counts the fleet streaming, not its start-up (controller/demo/run_clock.py)."""

from __future__ import annotations

import logging

import pytest

from controller.demo.run_clock import RunClock


def test_the_clock_starts_when_every_agent_is_connected() -> None:
    clock = RunClock(20.0, expected=3, started=100.0)
    clock.saw(105.0, connected=2)
    assert clock.ran(130.0) == 0.0 and not clock.done(130.0)  # still starting: no time counted
    clock.saw(112.0, connected=3)
    clock.saw(118.0, connected=2)  # an agent restarting later does not move the start
    assert clock.ran(120.0) == 8.0
    assert not clock.done(131.9)
    assert clock.done(132.0)


def test_agents_that_never_connect_start_the_clock_after_the_wait(caplog: pytest.LogCaptureFixture) -> None:
    clock = RunClock(10.0, expected=4, started=0.0, wait_seconds=60.0)
    clock.saw(59.0, connected=3)
    assert clock.since is None
    with caplog.at_level(logging.WARNING, logger="gpufleet.demo"):
        clock.saw(61.0, connected=3)
    assert clock.since == 61.0
    assert "only 3 of 4 agents connected" in caplog.text
    assert clock.done(71.0) and not clock.done(70.0)


def test_without_a_limit_the_run_never_ends_on_its_own() -> None:
    clock = RunClock(None, expected=1, started=0.0)
    clock.saw(1.0, connected=1)
    assert clock.ran(1e6) == 1e6 - 1.0 and not clock.done(1e6)
