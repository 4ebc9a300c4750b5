"""The agent's tuning service: one apply at a time over every level's actuators, the crash
recovery at start, and the committed profiles put back after a reboot.

`actuators(gpus)` gives the actuators an apply uses (OS, the GPUs asked for, BIOS): the
composition root (agent/compose/tuning.py) builds it for NVML or the simulator. Nothing here
knows which.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agent.tuning.apply import FAILED, NOTHING_TO_DO, REFUSED, ApplyResult, apply_settings, recover
from agent.tuning.base import Actuator, Change, Tree, TuningError
from agent.tuning.bios import PREFIX as BIOS
from agent.tuning.bios import BiosRebootState
from agent.tuning.desired import DesiredState, Pending, PendingChanges
from agent.tuning.journal import APPLIED
from agent.tuning.targets import Targets

log = logging.getLogger("gpufleet.agent.tuning")
ActuatorFactory = Callable[[Sequence[int] | None], list[Actuator]]
RebootCheck = Callable[[Sequence[Change]], BiosRebootState]
NO_JOURNAL = "no tuning state directory for the apply journal: nothing written"
DISABLED = "tuning is disabled on this agent (its config says tuning.enabled: false): nothing written"


class Tuner:
    def __init__(
        self,
        *,
        enabled: bool,
        tree: Tree,
        actuators: ActuatorFactory,
        state_dir: str | Path | None,
        after_reboot: RebootCheck | None = None,
    ) -> None:
        self.enabled = enabled
        self.tree = tree
        self.actuators = actuators
        self.after_reboot = after_reboot  # where committed BIOS changes stand (the BMC's view)
        self.journal_dir = None if state_dir is None else Path(state_dir) / "journal"
        self.desired = None if state_dir is None else DesiredState(state_dir)
        self.pending = None if state_dir is None else PendingChanges(state_dir)
        self._lock = threading.Lock()

    def apply(
        self,
        profile: str,
        targets: Mapping[str, Any],
        *,
        gpus: Sequence[int] = (),
        dry_run: bool = False,
        check: Callable[[list[Change]], list[str]] | None = None,
    ) -> ApplyResult:
        """Plan, apply and verify `targets` (a profile's {gpu, os, bmc} mappings); refused when tuning
        is off (a dry run is allowed: it writes nothing), while another apply runs, or on bad targets."""
        if not self.enabled and not dry_run:
            return ApplyResult(REFUSED, problems=[DISABLED])
        try:
            parsed = Targets.from_dict(targets)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            return ApplyResult(REFUSED, problems=[f"targets of profile {profile!r} are not valid: {exc}"])
        if self.journal_dir is None and not dry_run:
            return ApplyResult(REFUSED, problems=[NO_JOURNAL])
        if not self._lock.acquire(blocking=False):
            return ApplyResult(REFUSED, problems=["another apply is running on this node: nothing written"])
        try:
            actuators = self.actuators(list(gpus) or None)
            journal = self.journal_dir or Path("unused-by-a-dry-run")
            result = apply_settings(actuators, parsed, self.tree, journal, dry_run=dry_run, check=check)
            if result.state == APPLIED and self.desired is not None and self.pending is not None:
                try:
                    self.desired.commit(profile, targets, gpus)
                    self.pending.add(profile, [c for c in result.changes if c.setting.startswith(BIOS)])
                except TuningError as exc:  # applied and verified: say that it will not survive a reboot
                    result.problems.append(f"committed, but not kept for after a reboot: {exc}")
            return result
        except TuningError as exc:  # an actuator that cannot even be built (NVML gone)
            return ApplyResult(FAILED, problems=[str(exc)])
        finally:
            self._lock.release()

    def recover(self) -> list[ApplyResult]:
        """Finish what a killed apply left (rolled back to its snapshot, or needs_attention)."""
        if self.journal_dir is None or not self.journal_dir.exists():
            return []
        with self._lock:
            try:
                results = recover(self.journal_dir, self.tree, self.actuators(None))
            except TuningError as exc:  # NVML or the BMC unreachable: the journals stay, applies wait
                log.error("tuning: cannot finish an interrupted apply at start: %s", exc)
                return []
        for r in results:
            log.warning(
                "tuning: an apply interrupted earlier (%s) was finished at start: %s%s",
                r.op_id,
                r.state,
                f"; not back at the snapshot: {'; '.join(r.left)}" if r.left else "",
            )
        return results

    def check_pending(self) -> list[tuple[str, BiosRebootState]]:
        """At start: where the committed BIOS changes that waited for a reboot stand now. Verified
        (current at the target) and lost (neither current nor pending: the BIOS dropped them) ones
        are logged and forgotten; those still pending are kept for the next start."""
        if self.pending is None or self.after_reboot is None:
            return []
        try:
            entries = self.pending.load()
        except TuningError as exc:
            log.error("tuning: %s", exc)
            return []
        kept, seen = [], []
        for entry in entries:
            try:
                state = self.after_reboot(entry.changes)
            except TuningError as exc:  # the BMC unreachable: ask again at the next start
                log.warning("tuning: cannot check profile %s's BIOS changes now: %s", entry.profile, exc)
                kept.append(entry)
                continue
            seen.append((entry.profile, state))
            if state.verified:
                log.info(
                    "tuning: profile %s: BIOS changes now in effect: %s",
                    entry.profile,
                    ", ".join(state.verified),
                )
            if state.lost:
                log.error(
                    "tuning: profile %s: BIOS changes lost at the reboot (neither current nor pending): %s",
                    entry.profile,
                    ", ".join(state.lost),
                )
            if state.pending:
                log.info(
                    "tuning: profile %s: still pending the next reboot: %s",
                    entry.profile,
                    ", ".join(state.pending),
                )
                kept.append(
                    Pending(entry.profile, [c for c in entry.changes if c.setting in state.pending], entry.at)
                )
        if kept == entries:  # nothing verified or lost (nothing pending at all, often): nothing to write
            return seen
        try:
            self.pending.save(kept)
        except TuningError as exc:
            log.error("tuning: %s", exc)
        return seen

    def reapply(self) -> list[tuple[str, ApplyResult]]:
        """Put the committed profiles' GPU and OS settings back where a reboot lost them, oldest
        first; each one all or nothing like any apply. Logged, and returned for the caller to report."""
        if not self.enabled or self.desired is None:
            return []
        try:
            committed = self.desired.load()
        except TuningError as exc:
            log.error("tuning: %s", exc)
            return []
        done = []
        for entry in committed:
            result = self.apply(entry.profile, entry.targets, gpus=entry.gpus)
            if result.state == NOTHING_TO_DO:
                continue
            if result.state == APPLIED:
                log.warning(
                    "tuning: re-applied committed profile %s at start (%d settings had been lost: %s)",
                    entry.profile,
                    len(result.changes),
                    ", ".join(c.setting for c in result.changes),
                )
            else:
                log.error(
                    "tuning: could not re-apply committed profile %s at start: %s (%s)",
                    entry.profile,
                    result.state,
                    "; ".join(result.problems),
                )
            done.append((entry.profile, result))
        return done
