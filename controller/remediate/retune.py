"""The tuning loop on the controller: recommendations kept in step with the findings, applied
safely when the policy or an operator says so, and their outcome recorded.

- After each detection pass (`after_pass`), the findings' proposals (recommend.py) become rows in
  the store: one open row per node, cause and profile (proposed, approved or applying). A finding
  that clears drops the proposed (or approved, not yet applying) row that answers it; a finding
  that an apply already answered (whatever its outcome) is not proposed again while it stays
  active, so a fix that did not help is never retried in a loop. Policy `auto` approves a row
  whose risk is `online`; a fix that needs a reboot (BIOS, ECC) always waits for `approve`.
- An approved row, or an operator's `approve` or `retune` (operator_requests.py), is applied
  through the breaker on the command channel (applying.py); the agent's answer settles the row
  (outcomes.py).
- A drain row (a cause no setting fixes) follows the Kubernetes policy: `auto` approves it and
  `drains.after_pass` (controller/kube/policy.py) starts the drain when the node is free and the
  breaker has budget, the row following the drain; without a cluster it stays proposed, saying so.
- Every state is in the store: a restarted controller takes up the rows still applying (their
  commands are re-sent by the channel, or their stored outcome is recorded now).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Iterable

from controller.commands.channel import CommandChannel
from controller.config import ConfigError, ControllerConfig
from controller.errors import ControllerError
from controller.fleet.findings import StoredFinding
from controller.fleet.model import Fleet
from controller.profiles import ProfileError, load_catalogue, load_cause_map
from controller.remediate.audit import Auditor
from controller.remediate.guard import Breaker
from controller.remediate.operator_requests import NO_CLUSTER, OperatorRequests
from controller.remediate.recommend import Knowledge, Proposal, group_findings, profiles_for, propose_for
from controller.store.audit import AuditEntry
from controller.store.recommendations import FINAL_STATES, Recommendation
from controller.store.store import Store

log = logging.getLogger("gpufleet.controller.tuning")
APPLIED_ACTIONS = ("tune", "set_fleet_value")  # the actions that change settings
RECENT_COMMANDS = 200  # a node's commands searched for a restarted apply's own


class Tuner(OperatorRequests):
    """The tuning service: its loop here; operators' requests, starting applies and recording their
    outcomes in the parts it is built of (operator_requests.py, applying.py, outcomes.py)."""

    def __init__(
        self,
        config: ControllerConfig,
        store: Store,
        *,
        fleet: Callable[[], Fleet],
        active: Callable[[], Iterable[StoredFinding]],
        channel: CommandChannel,
        breaker: Breaker,
        auditor: Auditor,
        clock: Callable[[], float],
    ) -> None:
        try:
            catalogue = load_catalogue(config.tuning.profiles_dir)
            causes = load_cause_map()
        except ProfileError as exc:
            raise ConfigError(f"tuning: {exc}") from exc
        self.know = Knowledge(causes, catalogue, config.tuning.mode, config.detect, config.kubernetes.mode)
        self.store = store
        self._fleet = fleet  # the app replaces its Fleet when it loads the store: always ask
        self._active = active
        self.channel = channel
        self.breaker = breaker
        self.auditor = auditor
        self.clock = clock
        self.recs: dict[str, Recommendation] = {}  # every row this controller knows, by id
        self._by_command: dict[str, str] = {}  # ApplyProfile command id -> row id
        self._dry_runs: dict[str, AuditEntry] = {}  # dry-run command id -> its audit entry
        self._starting: set[str] = set()  # nodes an apply is being started on
        self.node_guard = None  # the app sets the Kubernetes side's check
        self.drains = None  # the app sets the Kubernetes side's drains (none: no drain is started)
        self._recorded: dict[str, asyncio.Event] = {}  # command id -> set once its outcome is stored
        self._tasks: set[asyncio.Task[None]] = set()
        channel.listeners.append(self._finished)

    async def load(self) -> None:
        """Take up the rows a previous controller left (after the channel reloaded its commands)."""
        for rec in await self.store.load_recommendations():
            self.recs[rec.id] = rec
            if rec.command_id:
                self._by_command[rec.command_id] = rec.id
        for rec in [r for r in self.recs.values() if r.state == "applying" and r.action in APPLIED_ACTIONS]:
            record = self.channel.get(rec.command_id)
            if record is not None and record.open:
                continue  # sent again on the node's next stream; its answer settles the row
            if record is None:
                stored = await self.store.list_commands(rec.node, RECENT_COMMANDS)
                record = next((r for r in stored if r.id == rec.command_id), None)
            await self._conclude(rec, record)

    # The loop

    async def after_pass(self) -> None:
        """Bring the rows in step with the active findings, start what is approved and may start
        now, and record the late answers of applies that timed out."""
        await self._reconcile()
        await self._apply_approved()
        await self._late_answers()
        if self.drains is not None:  # drain rows: started (auto) and kept in step with their drains
            await self.drains.after_pass()

    def forget_finished(self, before: float) -> int:
        """Drop the finished rows last changed before `before` from memory, as the store's prune drops
        them from the store (open rows stay, however old); how many went. Without it a long-running
        controller kept every row it ever finished, and every pass walked them all."""
        gone = [r for r in self.recs.values() if r.state in FINAL_STATES and r.updated < before]
        for rec in gone:
            del self.recs[rec.id]
            if rec.command_id and self._by_command.get(rec.command_id) == rec.id:
                del self._by_command[rec.command_id]
        return len(gone)

    async def _reconcile(self) -> None:
        now = self.clock()
        active = [s for s in self._active() if s.active]
        active_ids = {s.id for s in active}
        for rec in list(self.recs.values()):
            if rec.cause and rec.state in ("proposed", "approved"):
                cleared = not set(rec.finding_ids) & active_ids
                if cleared or self.know.mode(rec.cause) == "off":
                    del self.recs[rec.id]
                    await self.store.delete_recommendation(rec.id)
                    why = "its findings cleared" if cleared else "the policy is off for its cause"
                    log.info("recommendation %s (%s, %s) dropped: %s", rec.id, rec.node, rec.cause, why)
        fleet = self._fleet()
        for (node, cause), found in group_findings(active).items():
            entry = self.know.causes.get(cause)
            if entry is None or self.know.mode(cause) == "off":
                continue
            for profile in profiles_for(entry):
                rows = [
                    r for r in self.recs.values() if (r.node, r.cause, r.profile) == (node, cause, profile)
                ]
                if any(r.state in ("approved", "applying") for r in rows):
                    continue  # one open row per node, cause and profile; new findings wait for it
                covered = {fid for r in rows if not r.open for fid in r.finding_ids}
                fresh = [s for s in found if s.id not in covered]
                proposals = propose_for(node, cause, fresh, fleet, self.know) if fresh else []
                proposal = next((p for p in proposals if p.profile == profile), None)
                if proposal is not None:
                    editable = next((r for r in rows if r.state == "proposed"), None)
                    await self._upsert(editable, proposal, now)

    async def _upsert(self, rec: Recommendation | None, p: Proposal, now: float) -> None:
        applied = p.action in APPLIED_ACTIONS and bool(p.targets)
        auto = p.policy == "auto" and applied and p.risk == "online"
        detail = p.detail
        if p.policy == "auto" and applied and not auto:
            detail = _join(detail, "needs an approval: it takes effect at the next reboot, never automatic")
        if p.policy == "auto" and p.action == "drain":
            no_cluster = NO_CLUSTER if self.drains is None else self.drains.unavailable()
            auto = not no_cluster
            if no_cluster:
                detail = _join(detail, f"not drained automatically: {no_cluster}")
        state, requester = ("approved", "policy") if auto else ("proposed", "")
        fields = {
            "action": p.action,
            "policy": p.policy,
            "risk": p.risk,
            "finding_ids": p.finding_ids,
            "gpus": p.gpus,
            "changes": p.changes,
            "targets": p.targets,
            "expected_effect": p.expected_effect,
        }
        if rec is None:
            rec = Recommendation(
                id=uuid.uuid4().hex[:12],
                node=p.node,
                cause=p.cause,
                action=p.action,
                profile=p.profile,
                state=state,
                created=now,
                updated=now,
                detail=detail,
                requester=requester,
                reason=f"policy {p.policy}: {p.cause}",
            )
            self.recs[rec.id] = rec
            log.info(
                "recommendation %s: node %s %s -> %s %s (%s)",
                rec.id,
                p.node,
                p.cause,
                p.action,
                p.profile or "",
                state,
            )
        elif all(getattr(rec, k) == v for k, v in fields.items()) and (rec.state, rec.detail) == (
            state,
            detail,
        ):
            return
        for name, value in fields.items():
            setattr(rec, name, value)
        rec.state, rec.detail, rec.requester, rec.updated = state, detail, requester, now
        await self.store.save_recommendation(rec)

    async def _apply_approved(self) -> None:
        approved = (r for r in self.recs.values() if r.state == "approved" and r.action in APPLIED_ACTIONS)
        for rec in sorted(approved, key=lambda r: r.created):
            why = self._not_now(rec.node) or await self._held(rec.node)
            if not why:
                try:
                    await self._start(rec, rec.requester or "policy", rec.reason)
                    continue
                except ControllerError as exc:  # e.g. its stream closed a moment ago
                    why = str(exc)
            if rec.detail != f"waiting: {why}":
                rec.detail, rec.updated = f"waiting: {why}", self.clock()
                await self.store.save_recommendation(rec)

    async def _late_answers(self) -> None:
        for rec in list(self.recs.values()):
            if rec.state == "needs_attention" and rec.result is None and rec.command_id:
                record = self.channel.get(rec.command_id)
                if record is not None and record.result is not None:
                    log.info("node %s: late answer to apply %s recorded", rec.node, rec.command_id)
                    await self._conclude(rec, record)


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)
