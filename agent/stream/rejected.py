"""Frames set aside: ones the controller refuses for good, or that can never be sent (too big for
the gRPC message limit, or made under another node name). Resending them would stall the stream.

They leave the spool for `<spool dir>/rejected/`, kept for a person to look at: `<boot>-<seq>.frame`
(the frame as spooled) and `<boot>-<seq>.why` (one line: why). The directory is bounded: past
MAX_FILES frames or MAX_BYTES bytes the oldest set aside go first. Without a spool directory they
are only counted and logged.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from protos.gpufleet.v1 import telemetry_pb2 as pb

REJECTED_DIR = "rejected"
MAX_FILES = 100
MAX_BYTES = 64 * 1024 * 1024


class Rejected:
    def __init__(self, directory: Path | None, log: logging.Logger) -> None:
        self.directory = directory  # <spool dir>/rejected, or None
        self.log = log
        self.count = 0  # frames set aside since the agent started

    def keep(self, boot_id: str, seq: int, frame: pb.TelemetryFrame, held: Path | None, why: str) -> None:
        """Record one frame set aside: move its spool file (or write it) here, log it once."""
        self.count += 1
        where = self._store(boot_id, seq, frame, held, why)
        self.log.warning(
            "frame %s/%d set aside, not sent again: %s (%s; %d set aside since start)",
            boot_id,
            seq,
            why,
            "kept in " + str(where) if where is not None else "dropped",
            self.count,
        )

    def _store(
        self, boot_id: str, seq: int, frame: pb.TelemetryFrame, held: Path | None, why: str
    ) -> Path | None:
        if self.directory is None:
            if held is not None:
                with contextlib.suppress(OSError):
                    held.unlink()
            return None
        target = self.directory / f"{boot_id}-{seq:020d}.frame"
        try:
            self.directory.mkdir(exist_ok=True)
            if held is not None and held.exists():
                os.replace(held, target)
                os.utime(target)  # the time it was set aside: the oldest go first
            else:
                target.write_bytes(frame.SerializeToString())
            target.with_suffix(".why").write_text(why.replace("\n", " ") + "\n")
        except OSError as exc:
            self.log.warning("cannot keep a set-aside frame in %s: %s", self.directory, exc)
            if held is not None:
                with contextlib.suppress(OSError):
                    held.unlink()
            return None
        self._prune()
        return target

    def _prune(self) -> None:
        """Remove the oldest set-aside frames past MAX_FILES or MAX_BYTES."""
        assert self.directory is not None
        try:
            kept = [(p.stat().st_mtime, p.name, p) for p in self.directory.glob("*.frame")]
        except OSError:
            return
        kept.sort(reverse=True)  # newest first
        total = 0
        for i, (_, _, path) in enumerate(kept):
            with contextlib.suppress(OSError):
                total += path.stat().st_size
            if i >= MAX_FILES or total > MAX_BYTES:
                for gone in (path, path.with_suffix(".why")):
                    with contextlib.suppress(OSError):
                        gone.unlink()
