"""The command ids this agent has run, with their results: a repeat is answered, never run again.

In memory for the agent's life (bounded), and on disk under `<spool dir>/.commands/` when the agent
has a spool directory, so that an agent restart keeps them too. On disk each id is one
file: `<id>.started` written before the handler runs, replaced by `<id>.result` (a serialized
CommandResult) when it finishes. A `.started` without a result means the agent stopped mid-run: a
repeat is answered as failed rather than run again (a half-applied change is not re-applied blind).
"""

from __future__ import annotations

import logging
import os
import re
from collections import OrderedDict
from pathlib import Path

from protos.gpufleet.v1 import telemetry_pb2 as pb

log = logging.getLogger("gpufleet.agent.commands")
KEEP = 1024  # ids remembered, in memory and on disk
SAFE_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")
INTERRUPTED = "interrupted: the agent stopped while running this command; not run again"


class CommandMemory:
    def __init__(self, directory: str | os.PathLike[str] | None = None, keep: int = KEEP) -> None:
        self.keep = keep
        self._results: OrderedDict[str, pb.CommandResult] = OrderedDict()
        self.directory = Path(directory) if directory is not None else None
        kept: list[Path] = []
        if self.directory is not None:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                kept = sorted(self.directory.glob("*.result"), key=lambda p: (p.stat().st_mtime_ns, p.name))
            except OSError as exc:
                log.warning("command memory %s unusable, keeping ids in memory only: %s", self.directory, exc)
                self.directory, kept = None, []
        self._on_disk_order: OrderedDict[str, None] = OrderedDict((p.stem, None) for p in kept)

    def recall(self, command_id: str) -> pb.CommandResult | None:
        """The stored result of a command this agent already ran (or began and lost), else None."""
        result = self._results.get(command_id)
        if result is not None or not self._on_disk(command_id):
            return result
        assert self.directory is not None
        path = self.directory / f"{command_id}.result"
        try:
            return pb.CommandResult.FromString(path.read_bytes())
        except FileNotFoundError:
            if (self.directory / f"{command_id}.started").exists():
                return pb.CommandResult(command_id=command_id, ok=False, error=INTERRUPTED)
            return None
        except (OSError, ValueError) as exc:
            log.warning("command %s: stored result unreadable (%s)", command_id, exc)
            return pb.CommandResult(command_id=command_id, ok=False, error=f"stored result unreadable: {exc}")

    def started(self, command_id: str) -> None:
        if self._on_disk(command_id):
            self._write(f"{command_id}.started", b"")

    def finished(self, result: pb.CommandResult) -> None:
        cid = result.command_id
        self._results[cid] = result
        self._results.move_to_end(cid)
        while len(self._results) > self.keep:
            self._results.popitem(last=False)
        if self._on_disk(cid):
            assert self.directory is not None
            self._write(f"{cid}.result", result.SerializeToString())
            self._forget(f"{cid}.started")
            self._on_disk_order[cid] = None
            self._on_disk_order.move_to_end(cid)
            while len(self._on_disk_order) > self.keep:
                oldest, _ = self._on_disk_order.popitem(last=False)
                self._forget(f"{oldest}.result")

    def _on_disk(self, command_id: str) -> bool:
        return self.directory is not None and SAFE_ID.fullmatch(command_id) is not None

    def _write(self, name: str, data: bytes) -> None:
        assert self.directory is not None
        tmp = self.directory / f".{name}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            tmp.replace(self.directory / name)
        except OSError as exc:  # a full disk must not stop the command; memory still dedupes
            log.warning("command memory: cannot write %s: %s", name, exc)

    def _forget(self, name: str) -> None:
        assert self.directory is not None
        try:
            (self.directory / name).unlink(missing_ok=True)
        except OSError as exc:
            log.warning("command memory: cannot remove %s: %s", name, exc)
