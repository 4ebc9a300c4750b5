"""The spool: ordering, acks, persistence across restarts, corrupt files, a full disk, overflow."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from agent.stream.spool import CORRUPT_DIR, Spool
from protos.gpufleet.v1 import telemetry_pb2 as pb


def frame(boot: str, seq: int, t: float = 1_700_000_000.0) -> pb.TelemetryFrame:
    f = pb.TelemetryFrame(node="n1", boot_id=boot, seq=seq)
    f.time.FromNanoseconds(int((t + seq) * 1e9))
    return f


def drain(spool: Spool) -> list[tuple[str, int]]:
    out, cursor = [], -1
    while (entry := spool.next_after(cursor)) is not None:
        out.append((entry.boot_id, entry.seq))
        cursor = entry.ordinal
    return out


def test_memory_spool_orders_acks_and_reports_floor() -> None:
    spool = Spool(None)
    for seq in range(1, 6):
        spool.append(frame("b1", seq))
    assert drain(spool) == [("b1", s) for s in range(1, 6)]
    assert spool.floor("b1") == 1
    assert spool.ack("b1", 3) == 3
    assert drain(spool) == [("b1", 4), ("b1", 5)]
    assert spool.floor("b1") == 4
    assert spool.floor("other") == 0
    assert spool.ack("other", 99) == 0
    assert len(spool) == 2 and not spool.persistent


def test_next_after_survives_acks_of_what_the_cursor_already_passed() -> None:
    spool = Spool(None)
    entries = [spool.append(frame("b1", s)) for s in range(1, 4)]
    spool.ack("b1", 2)
    nxt = spool.next_after(entries[0].ordinal)
    assert nxt is not None and nxt.seq == 3
    assert spool.next_after(entries[2].ordinal) is None


def test_frames_persist_and_come_back_older_boot_first(tmp_path: Path) -> None:
    first = Spool(tmp_path)
    assert first.persistent
    for seq in (1, 2, 3):
        first.append(frame("old-boot", seq, t=1000.0))
    first.ack("old-boot", 1)
    assert sorted(p.name for p in (tmp_path / "old-boot").iterdir()) == [
        f"{2:020d}.frame",
        f"{3:020d}.frame",
    ]

    second = Spool(tmp_path)  # the agent restarted
    second.append(frame("new-boot", 1, t=5000.0))
    assert drain(second) == [("old-boot", 2), ("old-boot", 3), ("new-boot", 1)]
    assert second.floor("old-boot") == 2

    second.ack("old-boot", 3)
    assert not (tmp_path / "old-boot").exists()  # an emptied boot leaves no directory behind
    assert drain(Spool(tmp_path)) == [("new-boot", 1)]


def test_boot_order_follows_frame_time_not_name(tmp_path: Path) -> None:
    s = Spool(tmp_path)
    s.append(frame("zzz", 1, t=100.0))
    s.append(frame("aaa", 1, t=900.0))
    assert drain(Spool(tmp_path)) == [("zzz", 1), ("aaa", 1)]


def test_corrupt_and_stray_files_are_moved_aside(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    s = Spool(tmp_path)
    s.append(frame("b1", 1))
    s.append(frame("b1", 2))
    (tmp_path / "b1" / f"{2:020d}.frame").write_bytes(b"\xff\xff not a frame")
    (tmp_path / "b1" / f"{7:020d}.frame").write_bytes(frame("b1", 8).SerializeToString())  # name lies
    (tmp_path / "b1" / f".{9:020d}.tmp").write_bytes(b"half")
    with caplog.at_level(logging.WARNING):
        reopened = Spool(tmp_path)
    assert drain(reopened) == [("b1", 1)]
    quarantined = sorted(p.name for p in (tmp_path / CORRUPT_DIR).iterdir())
    assert quarantined == [f"b1-{2:020d}.frame", f"b1-{7:020d}.frame"]
    assert not (tmp_path / "b1" / f".{9:020d}.tmp").exists()
    assert "does not match its name" in caplog.text and "unreadable" in caplog.text


def test_full_disk_keeps_frames_in_memory_and_warns_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Spool(tmp_path)
    spool.append(frame("b1", 1))
    real_fsync = os.fsync

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with caplog.at_level(logging.WARNING):
        spool.append(frame("b1", 2))
        spool.append(frame("b1", 3))
    assert not spool.persistent
    assert [r.message for r in caplog.records].count(
        f"spool directory {tmp_path}: disk full; keeping frames in memory only until writes succeed again"
    ) == 1
    assert drain(spool) == [("b1", 1), ("b1", 2), ("b1", 3)]  # nothing lost while running
    assert not list((tmp_path / "b1").glob(".*.tmp"))

    monkeypatch.setattr(os, "fsync", real_fsync)
    spool.append(frame("b1", 4))
    assert spool.persistent
    spool.ack("b1", 4)
    assert len(spool) == 0 and not (tmp_path / "b1").exists()


def test_unusable_directory_falls_back_to_memory(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    spool = Spool(blocker / "spool")
    spool.append(frame("b1", 1))
    assert not spool.persistent and len(spool) == 1


def test_overflow_drops_the_oldest_and_counts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spool = Spool(tmp_path, max_frames=3)
    with caplog.at_level(logging.WARNING):
        for seq in range(1, 7):
            spool.append(frame("b1", seq))
    assert drain(spool) == [("b1", 4), ("b1", 5), ("b1", 6)]
    assert spool.dropped == 3 and spool.floor("b1") == 4
    assert len(list((tmp_path / "b1").iterdir())) == 3
    assert sum("spool full" in r.message for r in caplog.records) == 1  # rate-limited
    assert drain(Spool(tmp_path, max_frames=2)) == [("b1", 5), ("b1", 6)]


def test_rejects_frames_that_cannot_be_named_safely() -> None:
    spool = Spool(None)
    with pytest.raises(ValueError):
        spool.append(frame("../escape", 1))
    with pytest.raises(ValueError):
        spool.append(pb.TelemetryFrame(node="n", boot_id="b", seq=0))
    with pytest.raises(ValueError):
        Spool(None, max_frames=0)
