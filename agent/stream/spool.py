"""Frames waiting for the controller's ack, in memory and (optionally) on disk.

Every frame the agent makes goes here first and leaves only when the controller acks it (acks say
"everything of this boot up to seq N is durably stored"). With a directory, each frame is also one
file, `<dir>/<boot_id>/<seq:020d>.frame`, written atomically, so frames survive an agent restart and
are resent, older boots first. When the disk is full or unwritable the spool keeps going in memory
and says so once; when it holds `max_frames` it drops the oldest and counts them. A frame that can
never be delivered is set aside (`set_aside`, see rejected.py) into `<dir>/rejected/`.

Used from the agent's event loop only (not thread-safe).
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf.message import DecodeError

from agent.stream.rejected import REJECTED_DIR, Rejected
from protos.gpufleet.v1 import telemetry_pb2 as pb

SUFFIX = ".frame"
CORRUPT_DIR = ".corrupt"
DROP_LOG_EVERY_S = 60.0
_BOOT_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_FRAME_NAME = re.compile(r"^\d{20}\.frame$")


@dataclass(slots=True)
class SpoolEntry:
    ordinal: int  # position in sending order, unique within this process
    boot_id: str
    seq: int
    frame: pb.TelemetryFrame
    path: Path | None = field(default=None, repr=False)


class Spool:
    def __init__(
        self,
        directory: str | os.PathLike[str] | None,
        *,
        max_frames: int = 8640,
        log: logging.Logger | None = None,
    ) -> None:
        if max_frames < 1:
            raise ValueError("max_frames must be >= 1")
        self.max_frames = max_frames
        self.log = log or logging.getLogger("gpufleet.agent.spool")
        self.directory = Path(directory) if directory is not None else None
        self._entries: list[SpoolEntry] = []
        self._ordinals: list[int] = []
        self._next_ordinal = 0
        self._dropped = 0
        self._drops_unlogged = 0
        self._last_drop_log = -DROP_LOG_EVERY_S
        self._disk_ok = self.directory is not None
        self._boot_dirs: set[str] = set()
        self._rejected = Rejected(None if self.directory is None else self.directory / REJECTED_DIR, self.log)
        if self.directory is not None:
            self._open_directory(self.directory)

    # -- queries ------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def dropped(self) -> int:
        """Frames dropped because the spool was full."""
        return self._dropped

    @property
    def rejected(self) -> int:
        """Frames set aside since start (refused by the controller for good, or unsendable)."""
        return self._rejected.count

    @property
    def persistent(self) -> bool:
        """Whether new frames currently reach the disk."""
        return self._disk_ok

    def next_after(self, ordinal: int) -> SpoolEntry | None:
        """The first held entry after `ordinal` in sending order (-1: from the start)."""
        i = bisect.bisect_right(self._ordinals, ordinal)
        return self._entries[i] if i < len(self._entries) else None

    def floor(self, boot_id: str) -> int:
        """The lowest seq of `boot_id` still held (0 if none): lower ones were acked or dropped."""
        for entry in self._entries:
            if entry.boot_id == boot_id:
                return entry.seq
        return 0

    # -- changes ------------------------------------------------------------------------------

    def append(self, frame: pb.TelemetryFrame) -> SpoolEntry:
        if not _BOOT_ID.match(frame.boot_id) or frame.boot_id == REJECTED_DIR or frame.seq < 1:
            raise ValueError(f"frame needs a plain boot id and seq >= 1, got {frame.boot_id!r}/{frame.seq}")
        entry = SpoolEntry(self._next_ordinal, frame.boot_id, frame.seq, frame)
        self._next_ordinal += 1
        if self.directory is not None:
            entry.path = self._write(entry)
        self._entries.append(entry)
        self._ordinals.append(entry.ordinal)
        self._trim()
        return entry

    def ack(self, boot_id: str, seq: int) -> int:
        """Forget every frame of `boot_id` up to `seq`; return how many were released."""
        keep: list[SpoolEntry] = []
        released = 0
        for entry in self._entries:
            if entry.boot_id == boot_id and entry.seq <= seq:
                self._unlink(entry)
                released += 1
            else:
                keep.append(entry)
        if released:
            self._entries = keep
            self._ordinals = [e.ordinal for e in keep]
            if not any(e.boot_id == boot_id for e in keep):
                self._remove_boot_dir(boot_id)
        return released

    def set_aside(self, boot_id: str, seq: int, why: str) -> bool:
        """Take frame (boot_id, seq) out of the spool for good, keeping it in rejected/ and logging it
        once; False when the spool does not hold it."""
        found = next((i for i, e in enumerate(self._entries) if (e.boot_id, e.seq) == (boot_id, seq)), None)
        if found is None:
            return False
        entry = self._entries.pop(found)
        del self._ordinals[found]
        self._rejected.keep(boot_id, seq, entry.frame, entry.path, why)
        if not any(e.boot_id == boot_id for e in self._entries):
            self._remove_boot_dir(boot_id)
        return True

    # -- internals ----------------------------------------------------------------------------

    def _trim(self) -> None:
        excess = len(self._entries) - self.max_frames
        if excess <= 0:
            return
        for entry in self._entries[:excess]:
            self._unlink(entry)
        gone = {e.boot_id for e in self._entries[:excess]}
        del self._entries[:excess]
        del self._ordinals[:excess]
        for boot in gone - {e.boot_id for e in self._entries}:
            self._remove_boot_dir(boot)
        self._dropped += excess
        self._drops_unlogged += excess
        now = time.monotonic()
        if now - self._last_drop_log >= DROP_LOG_EVERY_S:
            self.log.warning(
                "spool full (%d frames): dropped the %d oldest unacked frames (%d in all)",
                self.max_frames,
                self._drops_unlogged,
                self._dropped,
            )
            self._drops_unlogged = 0
            self._last_drop_log = now

    def _write(self, entry: SpoolEntry) -> Path | None:
        assert self.directory is not None
        boot_dir = self.directory / entry.boot_id
        path = boot_dir / f"{entry.seq:020d}{SUFFIX}"
        tmp = boot_dir / f".{entry.seq:020d}.tmp"
        try:
            if entry.boot_id not in self._boot_dirs:
                boot_dir.mkdir(parents=True, exist_ok=True)
                self._boot_dirs.add(entry.boot_id)
            with open(tmp, "wb") as fh:
                fh.write(entry.frame.SerializeToString())
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            if self._disk_ok:
                why = "disk full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else exc.strerror or str(exc)
                self.log.warning(
                    "spool directory %s: %s; keeping frames in memory only until writes succeed again",
                    self.directory,
                    why,
                )
                self._disk_ok = False
            return None
        if not self._disk_ok:
            self.log.info("spool directory %s is writable again", self.directory)
            self._disk_ok = True
        return path

    def _unlink(self, entry: SpoolEntry) -> None:
        if entry.path is not None:
            with contextlib.suppress(FileNotFoundError):
                try:
                    entry.path.unlink()
                except OSError as exc:
                    self.log.warning("spool: cannot remove %s: %s", entry.path, exc)

    def _remove_boot_dir(self, boot_id: str) -> None:
        if self.directory is None:
            return
        self._boot_dirs.discard(boot_id)
        with contextlib.suppress(OSError):  # not empty (a stray file) or already gone: leave it
            (self.directory / boot_id).rmdir()

    def _open_directory(self, directory: Path) -> None:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self.log.warning(
                "spool directory %s is unusable (%s); keeping frames in memory only", directory, exc
            )
            self._disk_ok = False
            return
        loaded: list[tuple[float, str, int, pb.TelemetryFrame, Path]] = []
        first_seen: dict[str, float] = {}
        # Dot-directories are not boots: .corrupt, and .commands (the agent's command memory); nor is
        # rejected/, the frames set aside.
        boot_dirs = (p for p in directory.iterdir() if p.is_dir() and not p.name.startswith("."))
        for boot_dir in sorted(p for p in boot_dirs if p.name != REJECTED_DIR):
            for path in sorted(boot_dir.iterdir()):
                if path.name.endswith(".tmp"):  # a write cut short by a crash: never acknowledged
                    with contextlib.suppress(OSError):
                        path.unlink()
                    continue
                frame = self._read(path, boot_dir.name)
                if frame is None:
                    continue
                ts = frame.time.seconds + frame.time.nanos / 1e9
                first_seen[boot_dir.name] = min(first_seen.get(boot_dir.name, ts), ts)
                loaded.append((ts, boot_dir.name, frame.seq, frame, path))
        loaded.sort(key=lambda item: (first_seen[item[1]], item[1], item[2]))
        for _, boot, seq, frame, path in loaded:
            entry = SpoolEntry(self._next_ordinal, boot, seq, frame, path)
            self._next_ordinal += 1
            self._entries.append(entry)
            self._ordinals.append(entry.ordinal)
            self._boot_dirs.add(boot)
        if loaded:
            self.log.info(
                "spool %s: %d unacked frames from %d earlier boots", directory, len(loaded), len(first_seen)
            )
        self._trim()

    def _read(self, path: Path, boot_id: str) -> pb.TelemetryFrame | None:
        problem = ""
        frame = pb.TelemetryFrame()
        if not _FRAME_NAME.match(path.name) or not _BOOT_ID.match(boot_id):
            problem = "not a spool file name"
        else:
            try:
                frame.ParseFromString(path.read_bytes())
            except (OSError, DecodeError) as exc:
                problem = f"unreadable ({exc})"
            else:
                if frame.boot_id != boot_id or frame.seq != int(path.name[: -len(SUFFIX)]):
                    problem = "its content does not match its name"
        if not problem:
            return frame
        assert self.directory is not None
        quarantine = self.directory / CORRUPT_DIR
        target = quarantine / f"{boot_id}-{path.name}"
        try:
            quarantine.mkdir(exist_ok=True)
            os.replace(path, target)
            self.log.warning("spool: %s is %s; moved to %s", path, problem, target)
        except OSError as exc:
            self.log.warning(
                "spool: %s is %s and cannot be moved aside (%s); skipping it", path, problem, exc
            )
        return None
