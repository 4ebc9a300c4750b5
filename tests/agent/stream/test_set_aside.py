"""Permanent errors against a real controller: a frame that can never be stored is set aside (kept in
<spool>/rejected/, counted, logged once) and the stream goes on at once; transient errors keep the
backoff."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.stream.backoff import Backoff
from agent.stream.client import MAX_MESSAGE_BYTES, StreamClient
from agent.stream.spool import Spool
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.harness import T0, Running, config, hello, running_controller

LOG = "tests.agent.stream.set_aside"
TIMEOUT = 10.0


class RecordingBackoff(Backoff):
    """Every delay asked for is recorded; a set-aside frame must ask for none."""

    def __init__(self) -> None:
        super().__init__(0.01, 0.05)
        self.attempts: list[int] = []

    def delay(self, attempt: int) -> float:
        self.attempts.append(attempt)
        return super().delay(attempt)


def frame(seq: int, node: str = "n1", boot: str = "boot-new", t: float = T0) -> pb.TelemetryFrame:
    f = pb.TelemetryFrame(node=node, boot_id=boot, seq=seq)
    f.time.FromSeconds(int(t) - 100 + seq)
    f.gpus.add(index=0, power_watts=400.0 + seq)
    return f


def client(
    address: str, spool: Spool, first: pb.Hello | None = None, max_message_bytes: int = MAX_MESSAGE_BYTES
) -> tuple[StreamClient, RecordingBackoff]:
    backoff = RecordingBackoff()
    stream = StreamClient(
        address,
        spool,
        lambda: hello("n1", boot="boot-new") if first is None else first,
        _no_commands,
        backoff=backoff,
        log=logging.getLogger(LOG),
        max_message_bytes=max_message_bytes,
    )
    return stream, backoff


async def _no_commands(command: pb.Command) -> pb.CommandResult:
    return pb.CommandResult(command_id=command.id, ok=True)


async def stream_until(stream: StreamClient, done: Callable[[], bool], what: str) -> None:
    """Run the client until `done()` holds (or fail after TIMEOUT), then stop it cleanly."""
    stop = asyncio.Event()
    task = asyncio.create_task(stream.run(stop))
    try:
        deadline = asyncio.get_running_loop().time() + TIMEOUT
        while not done():
            assert not task.done(), "the client ended on its own"
            assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.01)
    finally:
        stop.set()
        await asyncio.wait_for(task, TIMEOUT)


def set_aside_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "set aside, not sent again" in r.getMessage()]


def rejected(directory: Path) -> list[str]:
    return sorted(p.name for p in (directory / "rejected").glob("*.frame"))


def test_a_renamed_nodes_old_spool_no_longer_stalls(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The agent was node `old-name`; its spool still holds frames made under that name. Renamed to
    n1, it sets them aside (the controller would refuse them for good) and its new frames are acked."""
    old = Spool(tmp_path)
    for seq in (1, 2, 3):
        old.append(frame(seq, node="old-name", boot="boot-old"))
    spool = Spool(tmp_path)  # the agent restarted under its new name
    for seq in (1, 2):
        spool.append(frame(seq))

    async def scenario() -> None:
        async with running_controller() as running:
            stream, backoff = client(running.address, spool)
            await stream_until(stream, lambda: len(spool) == 0, "every frame acked or set aside")
            assert running.app.fleet.acked[("n1", "boot-new")] == 2
            assert ("old-name", "boot-old") not in running.app.fleet.acked
            assert stream.rejected == 3 and backoff.attempts == []

    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())
    assert rejected(tmp_path) == [f"boot-old-{s:020d}.frame" for s in (1, 2, 3)]
    why = (tmp_path / "rejected" / f"boot-old-{1:020d}.why").read_text()
    assert "made as node 'old-name'; this agent is now node 'n1'" in why
    assert len(set_aside_lines(caplog)) == 3  # once per frame
    assert len(Spool(tmp_path)) == 0  # and they do not come back after a restart


def test_a_frame_the_controller_refuses_is_set_aside_and_the_stream_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Spool(tmp_path)
    for seq in range(1, 6):
        f = frame(seq)
        if seq == 3:
            f.time.FromSeconds(631_152_000)  # 1990: refused by the controller, for good
        spool.append(f)

    async def scenario() -> None:
        async with running_controller() as running:
            stream, backoff = client(running.address, spool)
            await stream_until(stream, lambda: len(spool) == 0, "every frame acked or set aside")
            assert running.app.fleet.acked[("n1", "boot-new")] == 5  # 3 skipped by the spool floor
            assert running.app.ingest.counters.refused == 1
            assert stream.rejected == 1 and backoff.attempts == []  # no backoff for a permanent error

    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())
    assert rejected(tmp_path) == [f"boot-new-{3:020d}.frame"]
    why = (tmp_path / "rejected" / f"boot-new-{3:020d}.why").read_text()
    assert "refused by the controller: frame 3: time is before 2000-01-01" in why
    assert len(set_aside_lines(caplog)) == 1


def test_a_frame_over_the_send_limit_is_set_aside_before_sending(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    for seq in (1, 2, 3):
        f = frame(seq)
        if seq == 2:
            f.collectors.add(name="big", success=False, error="x" * 80_000)
        spool.append(f)

    async def scenario() -> None:
        async with running_controller() as running:
            stream, backoff = client(running.address, spool, max_message_bytes=64 * 1024)
            await stream_until(stream, lambda: len(spool) == 0, "every frame acked or set aside")
            assert running.app.fleet.acked[("n1", "boot-new")] == 3
            assert stream.rejected == 1 and backoff.attempts == []

    asyncio.run(scenario())
    assert rejected(tmp_path) == [f"boot-new-{2:020d}.frame"]
    assert (
        "over the 65536-byte message limit" in (tmp_path / "rejected" / f"boot-new-{2:020d}.why").read_text()
    )


def test_a_controller_with_a_smaller_limit_teaches_the_agent_its_limit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """gRPC refuses the big frame (RESOURCE_EXHAUSTED, not tied to a frame by the controller); the
    agent adopts the limit gRPC names, sets the frame aside, and the rest is acked."""
    spool = Spool(None)
    for seq in (1, 2, 3):
        f = frame(seq)
        if seq == 2:
            f.collectors.add(name="big", success=False, error="x" * 80_000)
        spool.append(f)

    async def scenario() -> None:
        async with running_controller(config(max_message_bytes=64 * 1024)) as running:
            stream, _ = client(running.address, spool)
            await stream_until(stream, lambda: len(spool) == 0, "every frame acked or set aside")
            assert running.app.fleet.acked[("n1", "boot-new")] == 3
            assert stream.max_message_bytes == 64 * 1024 and stream.rejected == 1

    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())
    assert len(set_aside_lines(caplog)) == 1


def test_transient_errors_keep_the_backoff(caplog: pytest.LogCaptureFixture) -> None:
    """A refusal that names no frame (here a Hello without a boot id) is retried with backoff, and
    nothing is set aside."""
    spool = Spool(None)
    spool.append(frame(1))

    async def scenario(running: Running) -> None:
        stream, backoff = client(running.address, spool, pb.Hello(node="n1"))  # INVALID_ARGUMENT
        await stream_until(stream, lambda: len(backoff.attempts) >= 3, "three retries")
        assert backoff.attempts == [0, 1, 2, *backoff.attempts[3:]]
        assert stream.rejected == 0 and len(spool) == 1

    async def go() -> None:
        async with running_controller() as running:
            await scenario(running)

    asyncio.run(go())


def test_a_refusal_naming_a_frame_the_spool_does_not_hold_keeps_the_backoff() -> None:
    spool = Spool(None)
    assert not spool.set_aside("boot-new", 7, "not held")
    assert spool.rejected == 0


# -- the spool's side ---------------------------------------------------------------------------


def test_set_aside_moves_the_file_keeps_the_floor_right_and_survives_a_restart(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    for seq in (1, 2, 3):
        spool.append(frame(seq))
    assert spool.set_aside("boot-new", 1, "refused by the controller: frame 1: time is before 2000-01-01")
    assert spool.floor("boot-new") == 2 and spool.rejected == 1
    assert not spool.set_aside("boot-new", 1, "again")  # gone from the spool: once only
    assert sorted(p.name for p in (tmp_path / "boot-new").iterdir()) == [f"{s:020d}.frame" for s in (2, 3)]
    kept = pb.TelemetryFrame.FromString((tmp_path / "rejected" / f"boot-new-{1:020d}.frame").read_bytes())
    assert kept == frame(1)
    assert [e.seq for e in Spool(tmp_path)._entries] == [2, 3]  # rejected/ is not a boot


def test_the_rejected_directory_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agent.stream.rejected.MAX_FILES", 3)
    spool = Spool(tmp_path)
    for seq in range(1, 7):
        spool.append(frame(seq))
    for seq in range(1, 6):
        spool.set_aside("boot-new", seq, f"reason {seq}")
    names = sorted(p.name for p in (tmp_path / "rejected").iterdir())
    assert names == [f"boot-new-{s:020d}.{kind}" for s in (3, 4, 5) for kind in ("frame", "why")]
    assert spool.rejected == 5 and len(spool) == 1


def test_the_rejected_directory_is_bounded_in_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agent.stream.rejected.MAX_BYTES", 2500)
    spool = Spool(tmp_path)
    for seq in (1, 2, 3):
        f = frame(seq)
        f.collectors.add(name="c", error="e" * 1000)
        spool.append(f)
        spool.set_aside("boot-new", seq, "too big")
    assert sorted(p.name for p in (tmp_path / "rejected").glob("*.frame")) == [
        f"boot-new-{s:020d}.frame" for s in (2, 3)
    ]


def test_a_memory_spool_counts_what_it_sets_aside() -> None:
    spool = Spool(None)
    spool.append(frame(1))
    spool.append(frame(2))
    assert spool.set_aside("boot-new", 2, "too big")
    assert spool.rejected == 1 and [e.seq for e in spool._entries] == [1]


def test_a_boot_cannot_be_named_like_the_rejected_directory() -> None:
    with pytest.raises(ValueError, match="plain boot id"):
        Spool(None).append(frame(1, boot="rejected"))
