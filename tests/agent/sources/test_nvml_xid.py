"""NvmlSource's XID watch: an NVML event set waited on in its own thread, counted per GPU and code."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import pynvml
import pytest

from agent.sources.gpu import GpuReading, XidCount
from agent.sources.nvml import source as nvml_module
from agent.sources.nvml import xid as nvml_xid
from agent.sources.nvml.source import NvmlSource
from tests.agent.sources.test_nvml_fake import FakeNvml, fast_xid_thread


@pytest.fixture(autouse=True)
def _fast_xid(monkeypatch: pytest.MonkeyPatch) -> None:
    fast_xid_thread(monkeypatch)


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml()


@pytest.fixture
def source(fake: FakeNvml) -> Iterator[NvmlSource]:
    with NvmlSource(nvml=fake.module) as s:
        yield s


def read_until(
    source: NvmlSource, done: Callable[[dict[int, GpuReading]], bool], timeout: float = 5.0
) -> tuple[dict[int, GpuReading], dict[int, list[int]]]:
    """Read until `done(last readings)`; returns them and every XID event code seen per GPU."""
    seen: dict[int, list[int]] = {}
    deadline = time.monotonic() + timeout
    while True:
        readings = {r.index: r for r in source.read()}
        for r in readings.values():
            seen.setdefault(r.index, []).extend(e.code for e in r.xid_events)
        if done(readings):
            return readings, seen
        assert time.monotonic() < deadline, "the XIDs never arrived"
        time.sleep(0.005)


def settle(fake: FakeNvml, timeout: float = 5.0) -> None:
    """Wait until the XID thread has recorded every event queued so far."""
    deadline = time.monotonic() + timeout
    while not fake.events.empty():
        assert time.monotonic() < deadline
        time.sleep(0.001)
    # The thread records an event before it waits again: one more wait means the last is recorded.
    waits = fake.calls[("nvmlEventSetWait_v2", None)]
    while fake.calls[("nvmlEventSetWait_v2", None)] <= waits:
        assert time.monotonic() < deadline
        time.sleep(0.001)


def xid_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "nvml-xid"]


def test_xids_are_counted_per_gpu_and_code_and_carried_once(fake: FakeNvml, source: NvmlSource) -> None:
    assert fake.registered == [
        (0, pynvml.nvmlEventTypeXidCriticalError),
        (1, pynvml.nvmlEventTypeXidCriticalError),
    ]
    start = time.time()
    for gpu, code in ((0, 48), (0, 94), (0, 48), (1, 13)):
        fake.xid(gpu, code)
    readings, seen = read_until(
        source, lambda r: r[0].xid_counts == [XidCount(48, 2), XidCount(94, 1)] and r[1].xid_counts != []
    )
    assert seen == {0: [48, 94, 48], 1: [13]}  # each event in exactly one reading, in order
    assert readings[1].xid_counts == [XidCount(13, 1)]
    again = {r.index: r for r in source.read()}
    assert again[0].xid_events == [] and again[0].xid_counts == [XidCount(48, 2), XidCount(94, 1)]
    fake.xid(0, 48)
    readings, _ = read_until(source, lambda r: r[0].xid_counts[0] == XidCount(48, 3))
    assert [e.code for e in readings[0].xid_events] == [48]
    assert start <= readings[0].xid_events[0].unix_time_seconds <= time.time()


def test_xids_of_a_lost_gpu_are_still_counted_and_carried(fake: FakeNvml, source: NvmlSource) -> None:
    source.read()
    fake.gpus[0].lost = True
    assert [r.index for r in source.read()] == [1]  # lost, and nothing to carry yet
    fake.xid(0, 79)
    readings, seen = read_until(source, lambda r: 0 in r)
    lost = readings[0]
    assert seen[0] == [79] and lost.xid_counts == [XidCount(79, 1)]
    assert lost.uuid == fake.gpus[0].uuid
    assert lost.temperature_celsius is None and lost.nvlinks == []  # nothing else is read from it
    assert source.last_errors() == ["gpu 0 lost (fallen off the bus)"]
    assert source.read()[0].xid_events == []  # still carried, counts only


def test_the_xid_thread_survives_nvml_errors(
    fake: FakeNvml, source: NvmlSource, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agent.sources.nvml.xid")
    fake.events.put(pynvml.NVML_ERROR_UNKNOWN)
    fake.events.put(pynvml.NVML_ERROR_GPU_IS_LOST)
    fake.xid(1, 31)
    read_until(source, lambda r: r[1].xid_counts == [XidCount(31, 1)])
    messages = [r.getMessage() for r in caplog.records]
    assert any("waiting for XID events failed: Unknown Error" in m for m in messages)
    assert any("GPU is lost" in m for m in messages)
    assert len(xid_threads()) == 1


def test_close_stops_the_xid_thread_promptly_and_frees_the_set(fake: FakeNvml) -> None:
    source = NvmlSource(nvml=fake.module)
    assert len(xid_threads()) == 1
    start = time.monotonic()
    source.close()
    assert time.monotonic() - start < 0.5
    assert fake.wait_timeouts == {nvml_module._XID_WAIT_MS}  # each wait is bounded: close is prompt
    assert xid_threads() == []
    assert fake.event_sets == fake.event_sets_freed == 1
    assert source.calls == fake.calls.total()  # the thread's waits are counted too


def test_xid_events_off_starts_no_thread(fake: FakeNvml) -> None:
    with NvmlSource(nvml=fake.module, xid_events=False) as source:
        assert xid_threads() == []
        fake.xid(0, 48)
        r = source.read()[0]
    assert (r.xid_events, r.xid_counts) == ([], [])
    assert fake.registered == [] and fake.event_sets == 0


def test_a_gpu_that_cannot_report_xids_is_listed_unsupported(fake: FakeNvml) -> None:
    fake.gpus[0].xid = False
    with NvmlSource(nvml=fake.module) as source:
        h100, l40s = source.inventory().gpus
        fake.xid(1, 43)
        read_until(source, lambda r: r[1].xid_counts == [XidCount(43, 1)])
    assert {"xid_events", "xid_counts"} <= set(h100.unsupported_fields)
    assert "xid_events" not in l40s.unsupported_fields
    assert fake.registered == [(1, pynvml.nvmlEventTypeXidCriticalError)]


def test_an_xid_storm_keeps_the_latest_events_and_exact_counts(
    fake: FakeNvml, source: NvmlSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nvml_xid, "MAX_EVENTS", 3)
    for code in (13, 13, 31, 43, 45):
        fake.xid(0, code)
    settle(fake)
    readings, seen = read_until(source, lambda r: sum(c.total for c in r[0].xid_counts) == 5)
    assert seen[0] == [31, 43, 45]
    assert readings[0].xid_counts == [XidCount(13, 2), XidCount(31, 1), XidCount(43, 1), XidCount(45, 1)]
