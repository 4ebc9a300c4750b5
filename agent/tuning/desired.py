"""The committed profiles: desired state, kept on the agent's disk (`desired.json` in the tuning
state directory, rewritten atomically).

A profile that an apply committed stays wanted: GPU settings (NVML) and OS settings (/proc, /sys)
are lost when the node reboots, so the agent puts them back at start (`Tuner.reapply`). BIOS
settings persist in the BMC and are not kept here. Stopping the agent never reverts anything.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.tuning.base import Change
from agent.tuning.journal import JournalError, atomic_write

FILE = "desired.json"
PENDING_FILE = "pending.json"  # committed changes that take effect at the next reboot (BIOS)
VOLATILE = ("gpu", "os")  # the levels a reboot loses
KEEP = 32  # committed profiles remembered, oldest dropped first


@dataclass(frozen=True, slots=True)
class Committed:
    profile: str
    targets: dict[str, Any]  # {"gpu": {...}, "os": {...}}: the volatile levels of the profile
    gpus: list[int]  # [] every GPU
    at: float


class DesiredState:
    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / FILE

    def load(self) -> list[Committed]:
        """Oldest first; a file that cannot be read is reported, never guessed at."""
        if not self.path.exists():
            return []
        try:
            data = json.loads(self.path.read_text())
            return [Committed(e["profile"], e["targets"], list(e["gpus"]), float(e["at"])) for e in data]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise JournalError(f"cannot read the committed profiles {self.path}: {exc}") from None

    def commit(self, profile: str, targets: Mapping[str, Any], gpus: Sequence[int]) -> None:
        volatile = {level: dict(targets[level]) for level in VOLATILE if targets.get(level)}
        if not volatile:
            return
        kept = [c for c in self.load() if not (c.profile == profile and c.gpus == list(gpus))]
        kept.append(Committed(profile, volatile, list(gpus), round(time.time(), 3)))
        entries = [
            {"profile": c.profile, "targets": c.targets, "gpus": c.gpus, "at": c.at} for c in kept[-KEEP:]
        ]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path, json.dumps(entries, indent=1) + "\n")
        except OSError as exc:
            raise JournalError(f"cannot write the committed profiles {self.path}: {exc.strerror}") from None


@dataclass(frozen=True, slots=True)
class Pending:
    profile: str
    changes: list[Change]
    at: float


class PendingChanges:
    """Committed changes waiting for a reboot (BIOS attributes): checked at every agent start until
    the BMC shows them current (verified) or neither current nor pending (lost)."""

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / PENDING_FILE

    def load(self) -> list[Pending]:
        if not self.path.exists():
            return []
        try:
            data = json.loads(self.path.read_text())
            return [
                Pending(
                    e["profile"],
                    [Change(c["setting"], c["current"], c["target"], True) for c in e["changes"]],
                    float(e["at"]),
                )
                for e in data
            ]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise JournalError(f"cannot read the changes pending a reboot {self.path}: {exc}") from None

    def save(self, entries: Sequence[Pending]) -> None:
        data = [
            {
                "profile": e.profile,
                "changes": [
                    {"setting": c.setting, "current": c.current, "target": c.target} for c in e.changes
                ],
                "at": e.at,
            }
            for e in entries[-KEEP:]
        ]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path, json.dumps(data, indent=1) + "\n")
        except OSError as exc:
            raise JournalError(
                f"cannot write the changes pending a reboot {self.path}: {exc.strerror}"
            ) from None

    def add(self, profile: str, changes: Sequence[Change]) -> None:
        if changes:
            self.save([*self.load(), Pending(profile, list(changes), round(time.time(), 3))])
