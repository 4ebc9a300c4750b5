"""The journaled apply of OS-level targets, all or nothing:

plan (diff current vs target; nothing to do -> no writes) -> validate every change before any
write -> snapshot (the current values) into the journal -> apply each change, journaling each
write before it starts -> read back -> `applied`; or, on any failure, roll back every change
already started to its snapshot value and verify that (`rolled_back`; when the rollback itself
fails, `needs_attention` with what is left). `dry_run` returns the plan and writes nothing at all,
not even the journal. `recover` finishes, at agent start, a journal a killed process left; until
then (or while one needs attention) a new apply is refused, since recovery restores its snapshot.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent.tuning.base import Actuator, Change, Shortfall, Tree, TuningError
from agent.tuning.journal import (
    APPLIED,
    NEEDS_ATTENTION,
    ROLLED_BACK,
    ROLLING_BACK,
    VERIFYING,
    Journal,
    unfinished,
)
from agent.tuning.os_settings import os_actuators
from agent.tuning.targets import OsTargets, Targets, as_targets

# Outcomes besides the journal's final states: nothing written in any of these.
NOTHING_TO_DO, PLANNED, REFUSED, FAILED = "nothing_to_do", "planned", "refused", "failed"


@dataclass(slots=True)
class ApplyResult:
    state: str
    changes: list[Change] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    partial: list[str] = field(default_factory=list)  # read back short of the target (hugepages)
    left: list[str] = field(default_factory=list)  # settings not back at their snapshot
    op_id: str = ""

    @property
    def ok(self) -> bool:
        return self.state in (NOTHING_TO_DO, PLANNED, APPLIED)


def _tree(root: str | os.PathLike[str] | Tree) -> Tree:
    return root if isinstance(root, Tree) else Tree(root)


def apply_settings(
    actuators: Sequence[Actuator],
    targets: Targets | OsTargets,
    root: str | os.PathLike[str] | Tree,
    journal_dir: str | os.PathLike[str],
    *,
    dry_run: bool = False,
    check: Callable[[list[Change]], list[str]] | None = None,
) -> ApplyResult:
    """`check` runs after the read-back, while the journal still says `verifying` (a re-probe
    against the peers' bars): problems it returns roll the apply back like a failed write."""
    tree = _tree(root)
    targets = as_targets(targets)
    pending = [] if dry_run else unfinished(Path(journal_dir))
    if pending:
        # Its snapshot is what recover() restores: an apply on top would be undone by it.
        held = ", ".join(f"{j.op_id} ({j.state})" for j in pending)
        return ApplyResult(
            REFUSED, problems=[f"an earlier apply is unfinished: {held}; recover it first (nothing written)"]
        )
    planned: list[tuple[Actuator, Change]] = []
    try:
        for actuator in actuators:
            planned += [(actuator, change) for change in actuator.plan(tree, targets)]
        for actuator, change in planned:
            actuator.validate(tree, change)
    except TuningError as exc:
        return ApplyResult(REFUSED, [c for _, c in planned], problems=[str(exc)])
    changes = [c for _, c in planned]
    if not planned:
        return ApplyResult(NOTHING_TO_DO)
    if dry_run:
        return ApplyResult(PLANNED, changes)
    try:
        journal = Journal.create(journal_dir, [(a.name, c) for a, c in planned])
    except TuningError as exc:
        return ApplyResult(FAILED, changes, problems=[str(exc)])
    started: list[tuple[Actuator, Change]] = []
    try:
        for actuator, change in planned:
            journal.started(change.setting)
            started.append((actuator, change))
            actuator.apply(tree, change)
        journal.step(VERIFYING, "reading back")
        for actuator, change in planned:
            actuator.verify(tree, change)
        if check is not None:
            journal.step(VERIFYING, "read back at target; checking the effect")
            failed = check(changes)
            if failed:
                return roll_back(tree, journal, started, failed)
        journal.step(APPLIED, "at target")
    except TuningError as exc:
        result = roll_back(tree, journal, started, [str(exc)])
        result.partial = [str(exc)] if isinstance(exc, Shortfall) else []
        return result
    return ApplyResult(APPLIED, changes, op_id=journal.op_id)


def roll_back(
    tree: Tree, journal: Journal, started: Sequence[tuple[Actuator, Change]], problems: list[str]
) -> ApplyResult:
    """Put every started change back at its snapshot value (last first), then verify them all."""
    _journal(journal, ROLLING_BACK, "rolling back", problems)
    for actuator, change in reversed(started):
        back = change.reverse()
        try:
            if _current(tree, actuator, back.setting) != back.target:  # never started: left as is
                actuator.apply(tree, back)
        except TuningError as exc:
            problems.append(f"rollback: {exc}")
    left = []
    for actuator, change in started:
        try:
            actuator.verify(tree, change.reverse())
        except TuningError as exc:
            left.append(str(exc))
    state = NEEDS_ATTENTION if left else ROLLED_BACK
    journal.record["left"] = left
    _journal(journal, state, "rollback verified" if not left else "rollback incomplete")
    changes = [c for _, c in journal.changes()]
    return ApplyResult(state, changes, problems=problems, left=left, op_id=journal.op_id)


def _current(tree: Tree, actuator: Actuator, setting: str) -> str | None:
    try:
        return actuator.read(tree).get(setting)
    except TuningError:
        return None  # unreadable: write the snapshot value all the same


def _journal(journal: Journal, state: str, what: str, problems: list[str] | None = None) -> None:
    """Journal a rollback step; a journal that cannot be written must not stop the rollback."""
    try:
        journal.step(state, what, problems)
    except TuningError as exc:
        if problems is not None:
            problems.append(str(exc))


def recover(
    journal_dir: str | os.PathLike[str],
    root: str | os.PathLike[str] | Tree,
    actuators: Sequence[Actuator] | None = None,
) -> list[ApplyResult]:
    """At agent start: roll every journal left unfinished (killed mid-apply, or a rollback that
    needed attention) back to its snapshot and verify it; what cannot be is flagged needs_attention."""
    tree = _tree(root)
    by_name = {a.name: a for a in (os_actuators() if actuators is None else actuators)}
    results = []
    for journal in reversed(unfinished(Path(journal_dir))):  # undo newest first
        problems = [f"recovered after an interrupted apply (state {journal.state})"]
        started = []
        for name, change in journal.changes():
            actuator = by_name.get(name)
            if actuator is None:
                problems.append(f"{change.setting}: no actuator {name!r} to roll it back")
                continue
            started.append((actuator, change))
        result = roll_back(tree, journal, started, problems)
        if len(started) < len(journal.changes()) or not journal.record["changes"]:
            result.state = NEEDS_ATTENTION
            journal.record["state"] = NEEDS_ATTENTION
            _journal(journal, NEEDS_ATTENTION, "cannot roll every change back")
        results.append(result)
    return results
