"""controller --record leaves the disk to the store: below record_min_free_bytes free on its
filesystem the recording pauses (its messages counted lost, one warning), and resumes with room to
spare, saying how many it lost; telemetry is never held back."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from controller.record_space import CHECK_SECONDS, SpaceGuard, free_bytes
from controller.recording import Accepted, FileSink
from tests.controller.harness import T0, Clock, config, frame, hello, running_controller
from tests.controller.test_recording import generate

MB = 1 << 20


def _wait(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


class Disk:
    def __init__(self, free: int) -> None:
        self.free, self.looks = free, 0

    def __call__(self, path: str) -> int:
        self.looks += 1
        return self.free


def test_the_guard_pauses_under_the_reserve_and_resumes_with_room_to_spare(
    caplog: pytest.LogCaptureFixture,
) -> None:
    disk, now = Disk(5 * MB), [0.0]
    guard = SpaceGuard("/rec/fleet.jsonl.gz", 10 * MB, free=disk, clock=lambda: now[0])
    caplog.set_level(logging.INFO, "gpufleet.controller.recording")
    assert not guard.allows(64) and not guard.allows(64)
    assert disk.looks == 1  # looked at most every CHECK_SECONDS
    disk.free = 10 * MB  # the reserve exactly: still paused (no flapping at its edge)
    now[0] += CHECK_SECONDS
    assert not guard.allows(2)
    disk.free = 11 * MB
    now[0] += CHECK_SECONDS / 2
    assert not guard.allows(3) and disk.looks == 2  # not looked again yet
    now[0] += CHECK_SECONDS / 2
    assert guard.allows(64) and guard.allows(64) and not guard.paused
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert "paused: 5 MB free on its filesystem, under record_min_free_bytes (10 MB)" in messages[0]
    assert "resumed: 11 MB free; 133 messages were not recorded while it was paused" in messages[1]


def test_no_reserve_never_looks_and_an_unreadable_filesystem_does_not_pause() -> None:
    disk = Disk(0)
    assert SpaceGuard("x", 0, free=disk).allows(1) and disk.looks == 0

    def broken(path: str) -> int:
        raise OSError(5, "Input/output error")

    assert SpaceGuard("x", 10 * MB, free=broken).allows(1)


def test_free_bytes_is_the_filesystem_s_room_for_a_file_not_yet_made(tmp_path: Path) -> None:
    stats = os.statvfs(tmp_path)
    free = free_bytes(str(tmp_path / "not-yet.jsonl"))
    assert abs(free - stats.f_bavail * stats.f_frsize) < 64 * MB  # (other writers meanwhile)


def test_the_sink_writes_nothing_while_paused_and_counts_what_it_lost(tmp_path: Path) -> None:
    disk, now = Disk(1 * MB), [0.0]
    path = tmp_path / "fleet.jsonl"
    guard = SpaceGuard(str(path), 10 * MB, free=disk, clock=lambda: now[0])
    sink = FileSink(str(path), space=guard)
    sink.start()
    try:
        for seq in range(1, 4):
            sink.offer(Accepted(T0, "n1", frame=frame(seq)))
        _wait(lambda: sink.dropped == 3)
        assert not path.exists()  # not even opened
        disk.free, now[0] = 100 * MB, 5.0
        sink.offer(Accepted(T0, "n1", frame=frame(4)))
        _wait(lambda: sink.written == 1)
    finally:
        sink.close()
    assert sink.dropped == 3 and path.read_text().count("\n") == 1 and '"seq": "4"' in path.read_text()


def test_the_controller_records_with_its_reserve_and_never_holds_back_telemetry(tmp_path: Path) -> None:
    path = tmp_path / "fleet.jsonl.gz"
    reserve = free_bytes(str(path)) * 4  # more than this filesystem will ever have free

    async def go() -> None:
        async with running_controller(config(record=str(path), record_min_free_bytes=reserve), Clock()) as c:
            sink = c.app.record_sink
            assert sink is not None and sink.space is not None and sink.space.min_free == reserve
            await c.app.ingest.hello(hello("n1"))
            for seq in range(1, 4):
                assert await c.app.ingest.frame("n1", frame(seq)) == seq  # stored and acked all the same
            _wait(lambda: sink.dropped == 4)
            page = generate(c.app)
            assert "gpufleet_controller_record_paused 1.0" in page
            assert "gpufleet_controller_record_dropped_total 4.0" in page

    asyncio.run(go())
    assert not path.exists()
