"""The apply journal: one JSON file per operation in the agent's state directory, rewritten
atomically (temp file, fsync, rename, fsync of the directory) at every step.

It holds the snapshot (each change's `current`, the value to roll back to), the settings whose
write has started, the step log, and the state. A journal whose state is not final was left by a
process that died mid-apply: `recover` finishes it.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from agent.tuning.base import Change, TuningError

# States a journal passes through; the last three are final.
SNAPSHOT, APPLYING, VERIFYING, ROLLING_BACK = "snapshot", "applying", "verifying", "rolling_back"
APPLIED, ROLLED_BACK, NEEDS_ATTENTION = "applied", "rolled_back", "needs_attention"
FINAL = (APPLIED, ROLLED_BACK)  # needs_attention is retried at the next start


class JournalError(TuningError):
    """The journal could not be written: nothing may be changed without it."""


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Journal:
    def __init__(self, path: Path, record: dict[str, Any]) -> None:
        self.path = path
        self.record = record

    @classmethod
    def create(cls, directory: str | os.PathLike[str], changes: list[tuple[str, Change]]) -> Journal:
        """Write the snapshot: every change with its actuator, current value and target."""
        op_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
        record: dict[str, Any] = {
            "op_id": op_id,
            "state": SNAPSHOT,
            "changes": [
                {
                    "actuator": name,
                    "setting": c.setting,
                    "current": c.current,
                    "target": c.target,
                    "pending_reboot": c.pending_reboot,
                }
                for name, c in changes
            ],
            "started": [],
            "steps": [],
            "problems": [],
            "left": [],
        }
        try:
            Path(directory).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise JournalError(f"cannot keep the tuning journal in {directory}: {exc.strerror}") from None
        journal = cls(Path(directory) / f"{op_id}.json", record)
        journal.step(SNAPSHOT, "snapshot taken")
        return journal

    @classmethod
    def load(cls, path: Path) -> Journal:
        return cls(path, json.loads(path.read_text()))

    @property
    def op_id(self) -> str:
        return str(self.record["op_id"])

    @property
    def state(self) -> str:
        return str(self.record["state"])

    def changes(self) -> list[tuple[str, Change]]:
        return [
            (c["actuator"], Change(c["setting"], c["current"], c["target"], c.get("pending_reboot", False)))
            for c in self.record["changes"]
        ]

    def started(self, setting: str) -> None:
        self.record["started"].append(setting)
        self.step(APPLYING, f"writing {setting}")

    def step(self, state: str, what: str, problems: list[str] | None = None) -> None:
        self.record["state"] = state
        self.record["steps"].append({"at": round(time.time(), 3), "state": state, "step": what})
        if problems:
            self.record["problems"].extend(problems)
        self.save()

    def save(self) -> None:
        try:
            atomic_write(self.path, json.dumps(self.record, indent=1) + "\n")
        except OSError as exc:
            raise JournalError(f"cannot write the tuning journal {self.path}: {exc.strerror}") from None


def unfinished(directory: str | os.PathLike[str]) -> list[Journal]:
    """The journals left by an apply that did not reach a final state, oldest first."""
    found = []
    for path in sorted(Path(directory).glob("*.json")):
        try:
            journal = Journal.load(path)
        except (OSError, ValueError) as exc:  # never written half (atomic), but flag it all the same
            journal = Journal(
                path,
                {
                    "op_id": path.stem,
                    "state": NEEDS_ATTENTION,
                    "changes": [],
                    "started": [],
                    "steps": [],
                    "left": [],
                    "problems": [f"journal unreadable: {exc}"],
                },
            )
        if journal.state not in FINAL:
            found.append(journal)
    return found
