"""Starting an apply, or a dry run, on the command channel, and waiting for its outcome.

An apply is: the node known, connected, its agent accepting tuning (Hello.capabilities has
apply_profile), no other mutating command on it -> the breaker asked (which writes the audit entry
before anything acts) -> the row stored as `applying` with the command id -> the ApplyProfile
command issued on the command channel. An approved row of the policy waits for the breaker's budget
rather than trip it: it starts only when the breaker is armed and the node fits in its window. A
dry run is audited and sent (ApplyProfile.dry_run); no row, no breaker slot.

Nodes cordoned or in maintenance by someone else are not known to the controller yet (no
Kubernetes integration): the command channel's one-mutating-command-per-node rule is the guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from controller.commands.channel import CommandChannel
from controller.errors import ControllerError, FailedPrecondition, NotFound
from controller.fleet.model import Fleet, NodeState
from controller.remediate.bars import verify_bars
from controller.remediate.outcomes import KIND, Outcomes
from controller.remediate.recommend import Knowledge
from controller.store.commands import CommandRecord
from controller.store.recommendations import Recommendation
from protos.gpufleet.v1 import telemetry_pb2 as pb

log = logging.getLogger("gpufleet.controller.tuning")
OUTCOME_GRACE_SECONDS = 5.0  # after the answer, how long a waiter waits for its outcome to be stored


class BreakerRefused(ControllerError):
    """The blast-radius breaker refused the apply (RESOURCE_EXHAUSTED on the wire)."""


@dataclass(slots=True)
class Started:
    """An ApplyProfile command on its way: its channel record, audit entry and row (none: dry run)."""

    command: CommandRecord
    audit_id: str
    recommendation: Recommendation | None


class Applying(Outcomes):
    """The Tuner's part that starts applies (a mixin: the Tuner sets these attributes)."""

    know: Knowledge
    channel: CommandChannel
    _fleet: Callable[[], Fleet]  # the app replaces its Fleet when it loads the store: always ask
    _starting: set[str]  # nodes an apply is being started on
    # Why another actor's hold on the node refuses an apply ("" if none): set by the app to the
    # Kubernetes side (a drain running, someone else's cordon or maintenance).
    node_guard: Callable[[str], Awaitable[str]] | None

    async def wait(self, started: Started, timeout: float) -> None:
        """Return when the agent has answered and the outcome is stored, or `timeout` passed."""
        await self.channel.wait(started.command, timeout)
        recorded = self._recorded.get(started.command.id)
        if recorded is not None and not started.command.open:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(recorded.wait(), OUTCOME_GRACE_SECONDS)

    def _node(self, node: str) -> NodeState:
        state = self._fleet().nodes.get(node)
        if state is None:
            raise NotFound(f"node {node!r} is not known to this controller")
        return state

    def _check(self, node: str, *, dry_run: bool) -> None:
        """FailedPrecondition unless an ApplyProfile can go to `node` now."""
        state = self._node(node)
        if not self.channel.reachable(node) or not state.connected:
            raise FailedPrecondition(f"node {node} is not connected")
        if not dry_run and KIND not in state.hello.capabilities:
            raise FailedPrecondition(
                f"node {node} does not accept tuning: its agent's config does not say tuning.enabled: true"
            )
        holder = self.channel.mutating_holder(node)
        if holder is not None:
            raise FailedPrecondition(
                f"node {node} already has a mutating command in flight: {holder.id} "
                f"({holder.kind}, {holder.state}, requested by {holder.requester})"
            )
        if node in self._starting:
            raise FailedPrecondition(f"node {node}: another apply is being started")

    async def _held(self, node: str) -> str:
        """Why another actor's hold refuses an apply to `node` ("" if none): a drain running, or
        someone else's cordon or maintenance on the Kubernetes node."""
        return "" if self.node_guard is None else await self.node_guard(node)

    def _not_now(self, node: str) -> str:
        """Why an approved row of `node` cannot start now ("" if it can): what `_check` refuses, or
        the breaker tripped, or the node not fitting in the breaker's window."""
        try:
            self._check(node, dry_run=False)
        except ControllerError as exc:
            return str(exc)
        return self.breaker.wait_reason(node)

    async def _start(
        self, rec: Recommendation, requester: str, reason: str, *, stored: bool = True
    ) -> Started:
        """Ask the breaker (audited), store the row as applying, issue the command. `stored`:
        the row is in the store already (an operator's retune gets its row once allowed)."""
        self._check(rec.node, dry_run=False)
        self._starting.add(rec.node)
        try:
            params = {
                "profile": rec.profile,
                "gpus": rec.gpus,
                "recommendation_id": rec.id,
                "settings": [c.setting for c in rec.changes],
                "dry_run": False,
            }
            verdict = await self.breaker.request(
                "retune", rec.node, requester, reason, parameters=params, findings=rec.finding_ids
            )
            if not verdict.allowed:
                if stored:
                    rec.detail, rec.updated = f"the breaker refused it: {verdict.why}", self.clock()
                    await self.store.save_recommendation(rec)
                raise BreakerRefused(verdict.why)
            node = self._node(rec.node)
            settings = [f"gpu.{name}" for name in rec.targets.get("gpu", {})]
            apply = pb.ApplyProfile(
                profile=rec.profile,
                targets_json=json.dumps(rec.targets, sort_keys=True),
                gpus=rec.gpus,
                verify=verify_bars(self._fleet(), node, settings, rec.gpus, self.know.detect),
                reason=reason,
                recommendation_id=rec.id if rec.cause else "",  # empty: an operator's retune
            )
            command = pb.Command(id=uuid.uuid4().hex, apply_profile=apply)
            rec.state, rec.command_id, rec.detail, rec.result = "applying", command.id, "", None
            rec.breaker_action, rec.audit_id = verdict.action_id, verdict.audit.id
            rec.requester, rec.reason, rec.updated = requester, reason, self.clock()
            self.recs[rec.id] = rec
            self._by_command[command.id] = rec.id
            self._recorded[command.id] = asyncio.Event()
            await self.store.save_recommendation(rec)  # before the command: a restart finds it
            try:
                record = await self.channel.issue(rec.node, command, requester)
            except Exception as exc:
                self._recorded.pop(command.id, None)
                await self._conclude(rec, None, why=f"not sent: {exc}")
                raise
            log.info(
                "node %s: applying %s (command %s, %s): %d change(s), %d probe bar(s)",
                rec.node,
                rec.profile,
                command.id,
                requester,
                len(rec.changes),
                len(apply.verify),
            )
            return Started(record, verdict.audit.id, rec)
        finally:
            self._starting.discard(rec.node)

    async def _dry_run(
        self,
        node: str,
        profile: str,
        targets: dict[str, object],
        *,
        gpus: list[int],
        requester: str,
        reason: str,
        findings: list[str],
    ) -> Started:
        params = {"profile": profile, "gpus": gpus, "dry_run": True}
        entry = await self.auditor.begin(
            requester, "retune", node, parameters=params, reason=reason, findings=findings
        )
        apply = pb.ApplyProfile(
            profile=profile,
            targets_json=json.dumps(targets, sort_keys=True),
            dry_run=True,
            gpus=gpus,
            reason=reason,
        )
        command = pb.Command(id=uuid.uuid4().hex, apply_profile=apply)
        await self.auditor.outcome(entry, "allowed", f"dry run: command {command.id}")  # before any answer
        self._dry_runs[command.id] = entry
        self._recorded[command.id] = asyncio.Event()
        try:
            record = await self.channel.issue(node, command, requester)
        except Exception as exc:
            self._dry_runs.pop(command.id, None)
            self._recorded.pop(command.id, None)
            await self.auditor.outcome(entry, "refused", str(exc))
            raise
        return Started(record, entry.id, None)
