"""An apply's outcome: the agent's answer (the channel's listener) settling the row, the breaker
and the audit entry, and the answer described in one line.

Committed or nothing_to_do -> verified, rolled_back, needs_attention, anything else failed; no
answer in time -> needs_attention (recorded again if the late answer comes). The breaker is told the
outcome (failed and rolled-back applies keep their place in its window) and the audit entry gets
it. A dry run's answer goes to its audit entry only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from controller.remediate.audit import Auditor
from controller.remediate.guard import Breaker, Verdict
from controller.store.audit import AuditEntry
from controller.store.commands import CommandRecord
from controller.store.recommendations import Recommendation
from controller.store.store import Store
from protos.gpufleet.v1 import telemetry_pb2 as pb

log = logging.getLogger("gpufleet.controller.tuning")
KIND = "apply_profile"  # the command kind, and the Hello capability of an agent with tuning on
# The agent's ApplyProfileResult.state -> the recommendation's state; anything else: failed.
RESULT_STATES = {
    "committed": "verified",
    "nothing_to_do": "verified",
    "rolled_back": "rolled_back",
    "needs_attention": "needs_attention",
}
BREAKER_OUTCOMES = {"verified": "succeeded", "rolled_back": "rolled_back"}  # anything else: failed
DRY_RUN_OK = ("planned", "nothing_to_do")


class Outcomes:
    """The Tuner's part that records outcomes (a mixin: the Tuner sets these attributes)."""

    store: Store
    breaker: Breaker
    auditor: Auditor
    clock: Callable[[], float]
    recs: dict[str, Recommendation]  # every row this controller knows, by id
    _by_command: dict[str, str]  # ApplyProfile command id -> row id
    _dry_runs: dict[str, AuditEntry]  # dry-run command id -> its audit entry
    _recorded: dict[str, asyncio.Event]  # command id -> set once its outcome is stored
    _tasks: set[asyncio.Task[None]]

    async def settled(self) -> None:
        """Every answer received so far is recorded (for tests and an orderly stop)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks))

    def _finished(self, record: CommandRecord) -> None:
        """The channel's listener: an ApplyProfile of ours finished (answered, timed out, ...)."""
        if record.kind != KIND or (record.id not in self._dry_runs and record.id not in self._by_command):
            return
        task = asyncio.get_running_loop().create_task(self._record(record))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _record(self, record: CommandRecord) -> None:
        try:
            entry = self._dry_runs.pop(record.id, None)
            if entry is not None:
                result = _payload(record)
                ok = result is not None and result.state in DRY_RUN_OK
                detail = describe(result) if result is not None else record.error or record.state
                await self.auditor.outcome(entry, "succeeded" if ok else "failed", f"dry run: {detail}")
                return
            rec = self.recs.get(self._by_command.get(record.id, ""))
            if rec is not None and rec.state == "applying" and rec.command_id == record.id:
                await self._conclude(rec, record)
        except Exception:  # the outcome is lost for this run; the row is settled on the next start
            log.exception("node %s: outcome of command %s not recorded", record.node, record.id)
        finally:
            recorded = self._recorded.pop(record.id, None)
            if recorded is not None:
                recorded.set()

    async def _conclude(self, rec: Recommendation, record: CommandRecord | None, why: str = "") -> None:
        """Settle an applying row from its command: the row, the breaker and the audit entry."""
        result = _payload(record)
        if result is not None:
            state, detail = RESULT_STATES.get(result.state, "failed"), describe(result)
            rec.result = result
        elif record is None:
            state, detail = (
                "failed",
                why or "the controller stopped before the command was stored: never sent",
            )
        elif record.state == "timed_out" or record.failure == "restarted":
            state = "needs_attention"
            detail = (
                f"{record.error}: the outcome is unknown until the agent answers "
                f"(gpufleet commands --node {rec.node})"
            )
        else:
            state, detail = "failed", record.error or f"command {record.state}"
        rec.state, rec.detail, rec.updated = state, detail, self.clock()
        await self.store.save_recommendation(rec)
        log.log(
            logging.INFO if state == "verified" else logging.WARNING,
            "node %s: %s %s: %s",
            rec.node,
            rec.profile,
            state,
            detail,
        )
        audit = await self.store.get_audit(rec.audit_id) if rec.audit_id else None
        if audit is None:
            log.error("node %s: apply %s has no audit entry %r", rec.node, rec.id, rec.audit_id)
            audit = AuditEntry(rec.audit_id, rec.created, rec.requester, "retune", rec.node)
        with contextlib.suppress(KeyError):  # the audit entry is gone; the breaker has its outcome
            await self.breaker.finished(
                Verdict(True, "", rec.breaker_action, audit), BREAKER_OUTCOMES.get(state, "failed"), detail
            )


def _payload(record: CommandRecord | None) -> pb.ApplyProfileResult | None:
    if record is None or record.result is None or not record.result.HasField("apply_profile"):
        return None
    return record.result.apply_profile


def describe(result: pb.ApplyProfileResult) -> str:
    """The agent's answer in one line: its state, what changed or is pending, what missed."""
    parts = [result.state]
    pending = [c.setting for c in result.changes if c.pending_reboot]
    if result.changes:
        parts.append(f"{len(result.changes)} change(s)")
    if pending:
        parts.append(f"pending the next reboot: {', '.join(pending)}")
    for check in result.checks:
        if not check.passed:
            where = f"{check.probe} {check.variant}" + (
                f" on GPU {check.gpu}" if check.HasField("gpu") else ""
            )
            missed = check.error or f"{check.value:.4g}, normal {check.normal:.4g}, before {check.before:.4g}"
            parts.append(f"{where}: {missed}")
    parts += list(result.problems)
    if result.left:
        parts.append(f"not back at the snapshot: {', '.join(result.left)}")
    return "; ".join(parts)
