"""The command ids this agent has run, with their results: a repeat is answered, never run again.

In memory for the agent's life (bounded), and on disk under `<spool dir>/.commands/` when the agent
has a spool directory, so that an agent restart keeps them too (the agent then says
`command_memory` in Hello.capabilities, and the controller re-sends a restarted agent the commands
its previous boot was sent, same ids, rather than failing them blind). On disk each id is one
file: `<id>.started` written (and synced) before the handler runs, then `<id>.result` (a serialized
CommandResult) written and synced when it finishes; only then is `<id>.started` removed. A
`.started` without a result means the agent stopped mid-run (or could not write the result): a
repeat is answered as failed rather than run again (a half-applied change is not re-applied blind).
A `.result` that cannot be read or parsed is answered as failed ("stored result unreadable"), for
the id asked about. Files are pruned together, oldest first, KEEP ids at most.
"""

from __future__ import annotations

import logging
import os
import re
from collections import OrderedDict
from pathlib import Path

from google.protobuf.message import DecodeError

from protos.gpufleet.v1 import telemetry_pb2 as pb

log = logging.getLogger("gpufleet.agent.commands")
KEEP = 1024  # ids remembered, in memory and on disk
SAFE_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")
INTERRUPTED = "interrupted: the agent stopped while running this command; not run again"
UNREADABLE = "stored result unreadable"
SUFFIXES = (".result", ".started")


class MemoryUnwritable(OSError):
    """The `.started` mark could not be stored: a mutating command must not run without it."""


class CommandMemory:
    def __init__(self, directory: str | os.PathLike[str] | None = None, keep: int = KEEP) -> None:
        self.keep = keep
        self._results: OrderedDict[str, pb.CommandResult] = OrderedDict()
        self.directory = Path(directory) if directory is not None else None
        kept: list[Path] = []
        if self.directory is not None:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                for tmp in self.directory.glob(".*.tmp"):  # a write cut short by a previous stop
                    tmp.unlink(missing_ok=True)
                kept = sorted(
                    (p for p in self.directory.iterdir() if p.suffix in SUFFIXES),
                    key=lambda p: (p.stat().st_mtime_ns, p.name),
                )
            except OSError as exc:
                log.warning("command memory %s unusable, keeping ids in memory only: %s", self.directory, exc)
                self.directory, kept = None, []
        self._on_disk_order: OrderedDict[str, None] = OrderedDict((p.stem, None) for p in kept)
        self._prune()

    @property
    def durable(self) -> bool:
        """Ids are kept on disk: they survive an agent restart."""
        return self.directory is not None

    def recall(self, command_id: str) -> pb.CommandResult | None:
        """The stored result of a command this agent already ran (or began and lost), else None."""
        result = self._results.get(command_id)
        if result is not None or not self._on_disk(command_id):
            return result
        assert self.directory is not None
        path = self.directory / f"{command_id}.result"
        try:
            data = path.read_bytes()
            if not data:
                raise ValueError("empty file")
            result = pb.CommandResult.FromString(data)
        except FileNotFoundError:
            if (self.directory / f"{command_id}.started").exists():
                return pb.CommandResult(command_id=command_id, ok=False, error=INTERRUPTED)
            return None
        except (OSError, ValueError, DecodeError) as exc:
            log.warning("command %s: %s (%s)", command_id, UNREADABLE, exc)
            return pb.CommandResult(command_id=command_id, ok=False, error=f"{UNREADABLE}: {exc}")
        result.command_id = command_id  # whatever the file says, it answers the id asked about
        return result

    def started(self, command_id: str, *, required: bool = False) -> None:
        """Mark `command_id` as begun, on disk. `required` (a mutating command): raise
        MemoryUnwritable when the mark cannot be written, so the command is refused, not run."""
        if not self._on_disk(command_id):
            return
        try:
            self._write(f"{command_id}.started", b"")
        except OSError as exc:
            if required:
                raise MemoryUnwritable(f"cannot record the command as started: {exc}") from exc
            log.warning("command memory: cannot write %s.started: %s", command_id, exc)
            return
        self._remember(command_id)

    def finished(self, result: pb.CommandResult) -> None:
        cid = result.command_id
        self._results[cid] = result
        self._results.move_to_end(cid)
        while len(self._results) > self.keep:
            self._results.popitem(last=False)
        if not self._on_disk(cid):
            return
        try:
            self._write(f"{cid}.result", result.SerializeToString())
        except OSError as exc:  # a full disk must not stop the command; memory still dedupes
            # `.started` stays: after a restart a repeat is answered INTERRUPTED, never run twice.
            log.warning("command memory: cannot write %s.result (kept %s.started): %s", cid, cid, exc)
            return
        self._forget(f"{cid}.started")
        self._remember(cid)

    def _remember(self, cid: str) -> None:
        self._on_disk_order[cid] = None
        self._on_disk_order.move_to_end(cid)
        self._prune()

    def _prune(self) -> None:
        while len(self._on_disk_order) > self.keep:
            oldest, _ = self._on_disk_order.popitem(last=False)
            for suffix in SUFFIXES:
                self._forget(f"{oldest}{suffix}")

    def _on_disk(self, command_id: str) -> bool:
        return self.directory is not None and SAFE_ID.fullmatch(command_id) is not None

    def _write(self, name: str, data: bytes) -> None:
        """Write `name` durably (temporary file, fsync, rename, directory fsync); OSError when not."""
        assert self.directory is not None
        tmp = self.directory / f".{name}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            tmp.replace(self.directory / name)
        except OSError:
            self._forget(tmp.name)
            raise
        _sync_dir(self.directory)

    def _forget(self, name: str) -> None:
        assert self.directory is not None
        try:
            (self.directory / name).unlink(missing_ok=True)
        except OSError as exc:
            log.warning("command memory: cannot remove %s: %s", name, exc)


def _sync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
