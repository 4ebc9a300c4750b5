"""A leader's first detection pass waits for its detection process's copy of the fleet, which is
made while the controller already leads (controller/server.py _before_judging): the passes start
once the copy is done, a failed copy is stopped so the first pass makes a new one, and a stop
during the copy ends the loop without a pass."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import pytest

from controller.app import ControllerApp
from controller.config import DetectConfig
from controller.detection.process import DetectionUnavailable
from controller.errors import StoreUnavailable
from tests.controller.harness import Clock, config


def _run(body: Callable[[ControllerApp, list[int]], Awaitable[None]]) -> None:
    async def go() -> None:
        app = ControllerApp(config(detect=DetectConfig(interval_seconds=0.01)), clock=Clock())
        await app.start()
        passes = [0]
        pass_once = app.detection_pass

        async def counted() -> object:
            passes[0] += 1
            return await pass_once()

        app.detection_pass = counted  # type: ignore[method-assign,assignment]
        try:
            await body(app, passes)
        finally:
            app.close()

    asyncio.run(go())


async def _until(check: Callable[[], bool]) -> None:
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


def test_the_first_pass_waits_for_the_copy() -> None:
    async def body(app: ControllerApp, passes: list[int]) -> None:
        copied, stop = asyncio.Event(), asyncio.Event()
        copying = asyncio.create_task(copied.wait())
        loop = asyncio.create_task(app.detect_forever(stop, copying))  # type: ignore[arg-type]
        await asyncio.sleep(0.2)  # twenty intervals
        assert passes[0] == 0
        copied.set()
        await _until(lambda: passes[0] >= 2)
        stop.set()
        await loop

    _run(body)


def test_a_failed_copy_is_stopped_and_the_passes_go_on() -> None:
    class Pool:
        stopped = 0

        async def stop(self) -> None:
            self.stopped += 1

    async def body(app: ControllerApp, passes: list[int]) -> None:
        async def broken() -> None:
            raise BrokenPipeError("the detection process went away")

        pool, stop = Pool(), asyncio.Event()
        app.detection = pool  # type: ignore[assignment]
        app.detection_pass = _counting(passes)  # type: ignore[method-assign,assignment]
        loop = asyncio.create_task(app.detect_forever(stop, asyncio.create_task(broken())))
        await _until(lambda: passes[0] >= 1)
        assert pool.stopped == 1  # before the first pass, which starts a new process and copy
        stop.set()
        await loop

    _run(body)


def test_a_stop_during_the_copy_ends_the_loop_without_a_pass() -> None:
    async def body(app: ControllerApp, passes: list[int]) -> None:
        stop = asyncio.Event()
        copying = asyncio.create_task(asyncio.Event().wait())
        loop = asyncio.create_task(app.detect_forever(stop, copying))  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(loop, 5)
        assert passes[0] == 0 and not copying.done()
        copying.cancel()

    _run(body)


def _counting(passes: list[int]) -> Callable[[], Awaitable[None]]:
    async def counted() -> None:
        passes[0] += 1

    return counted


def test_a_pass_that_fails_for_a_known_reason_is_one_line_and_an_unforeseen_one_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A detection process that died (started again by the next pass) or a store that is down are
    operational: one error line each. Anything else keeps its traceback."""
    failures: list[Exception] = [
        DetectionUnavailable("the detection process ended"),
        StoreUnavailable("store unavailable: disk I/O error"),
        KeyError("bug"),
    ]

    async def body(app: ControllerApp, passes: list[int]) -> None:
        async def failing() -> None:
            passes[0] += 1
            if failures:
                raise failures.pop(0)

        stop = asyncio.Event()
        app.detection_pass = failing  # type: ignore[method-assign,assignment]
        loop = asyncio.create_task(app.detect_forever(stop))
        await _until(lambda: passes[0] >= 4)
        stop.set()
        await loop
        assert app.failed_passes == 3

    caplog.set_level(logging.ERROR, "gpufleet.controller")
    _run(body)
    failed = [r for r in caplog.records if r.getMessage().startswith("detection pass failed")]
    assert [(r.getMessage(), r.exc_info is not None) for r in failed] == [
        ("detection pass failed: the detection process ended", False),
        ("detection pass failed: store unavailable: disk I/O error", False),
        ("detection pass failed", True),
    ]
