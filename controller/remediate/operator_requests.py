"""An operator's requests: list the recommendations, retune a node with a profile (or plan it: a
dry run) and approve a proposed recommendation; each refusal audited with why. Approving a drain
recommendation starts the drain on the Kubernetes side (`drains`, set by the app)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Protocol

from controller.errors import ControllerError, FailedPrecondition, InvalidMessage, NotFound
from controller.fleet.findings import StoredFinding
from controller.remediate.applying import Applying, Started
from controller.remediate.plans import expected_effect, plan_profile
from controller.remediate.recommend import NO_FIX, profiles_for
from controller.store.recommendations import Recommendation

NO_CLUSTER = "no Kubernetes cluster is configured"


class Drains(Protocol):
    """The Kubernetes side of drain recommendations (controller/kube/policy.py, set by the app)."""

    def unavailable(self) -> str:
        """Why no drain can be started at all ("" when a cluster is configured)."""
        ...

    async def start(self, rec: Recommendation, requester: str, reason: str) -> Started:
        """Start the drain `rec` recommends; the row follows it (applying, then its outcome)."""
        ...

    async def wait(self, started: Started, timeout: float) -> None:
        """Return when the drain ended (the row settled) or `timeout` passed."""
        ...

    async def after_pass(self) -> None:
        """Start the policy's approved drains that may start now; settle the rows of ended drains."""
        ...


class OperatorRequests(Applying):
    """The Tuner's part that answers operators (a mixin: the Tuner sets these attributes)."""

    _active: Callable[[], Iterable[StoredFinding]]
    drains: Drains | None  # the drains of drain recommendations (None: no drain is started)

    async def recommendations(self, node: str = "", limit: int = 100) -> list[Recommendation]:
        """Newest first, from the store."""
        return await self.store.list_recommendations(node, limit)

    async def retune(
        self, node: str, profile: str, *, requester: str, reason: str, gpus: list[int], dry_run: bool
    ) -> Started:
        """Apply `profile` to `node` (its `gpus`; empty: every GPU), or plan it (dry run).
        NotFound, InvalidMessage, FailedPrecondition, BreakerRefused say why not (audited)."""
        params = {"profile": profile, "gpus": gpus, "dry_run": dry_run}
        try:
            state = self._node(node)
            entry = self.know.catalogue.get(profile)
            if entry is None:
                raise NotFound(f"no profile {profile!r} (gpufleet profiles lists them)")
            have = {g.index for g in state.hello.inventory.gpus} | set(state.gpus)
            missing = sorted(set(gpus) - have)
            if missing:
                has = ", ".join(map(str, sorted(have)))
                raise InvalidMessage(f"node {node} has no GPU {', '.join(map(str, missing))} (it has: {has})")
            plan = plan_profile(entry.profile, state, fleet=self._fleet(), gpus=gpus, detect=self.know.detect)
            if not plan.targets:
                raise FailedPrecondition(f"profile {profile} is recommend only (firmware): nothing to apply")
            self._check(node, dry_run=dry_run)
            held = "" if dry_run else await self._held(node)
            if held:
                raise FailedPrecondition(held)
        except ControllerError as exc:
            await self._refused(requester, node, params, reason, exc)
            raise
        findings = self._evidence(node, profile)
        if dry_run:
            return await self._dry_run(
                node, profile, plan.targets, gpus=gpus, requester=requester, reason=reason, findings=findings
            )
        now = self.clock()
        rec = Recommendation(
            id=uuid.uuid4().hex[:12],
            node=node,
            cause="",
            action="tune",
            profile=profile,
            state="approved",
            created=now,
            updated=now,
            risk=plan.risk,
            finding_ids=findings,
            gpus=list(gpus),
            changes=plan.changes,
            targets=plan.targets,
            expected_effect=expected_effect(entry.profile.description, plan),
        )
        return await self._start(rec, requester, reason, stored=False)

    async def approve(self, rec_id: str, *, requester: str, reason: str) -> Started:
        """Apply a proposed recommendation now, as `retune` would, or start the drain it recommends
        (audited when refused; a drain's refusals by the drain itself, as `gpufleet drain`'s)."""
        rec = self.recs.get(rec_id)
        drains: Drains | None = None  # a drain recommendation's
        try:
            if rec is None:
                raise NotFound(f"no recommendation {rec_id!r} (one whose findings cleared is dropped)")
            if rec.action == "drain":
                drains = self._drains_for(rec)
            else:
                await self._approvable(rec)
        except ControllerError as exc:
            params = {"recommendation_id": rec_id, "approve": True}
            action = "drain" if rec is not None and rec.action == "drain" else "retune"
            await self._refused(
                requester, "" if rec is None else rec.node, params, reason, exc, action=action
            )
            raise
        reason = reason or f"approved recommendation {rec.id} ({rec.cause})"
        if drains is not None:
            return await drains.start(rec, requester, reason)
        return await self._start(rec, requester, reason)

    async def _approvable(self, rec: Recommendation) -> None:
        """FailedPrecondition unless `rec` can be applied now."""
        if rec.action in NO_FIX:
            raise FailedPrecondition(
                f"recommendation {rec.id} is to {rec.action} node {rec.node}: no setting fixes "
                f"{rec.cause}, so there is nothing to apply ({NO_FIX[rec.action]})"
            )
        if rec.action == "recommend_firmware":
            raise FailedPrecondition(
                f"recommendation {rec.id} is firmware: recommended only, an operator schedules the update"
            )
        if rec.state != "proposed":
            raise FailedPrecondition(f"recommendation {rec.id} is {rec.state}, not proposed")
        if not rec.targets:
            raise FailedPrecondition(
                f"recommendation {rec.id} has nothing to apply ({rec.detail or 'no changes'})"
            )
        self._check(rec.node, dry_run=False)
        held = await self._held(rec.node)
        if held:
            raise FailedPrecondition(held)

    def _drains_for(self, rec: Recommendation) -> Drains:
        """The drains that can start `rec`'s drain; FailedPrecondition without a cluster, or when
        `rec` is not proposed."""
        why = NO_CLUSTER if self.drains is None else self.drains.unavailable()
        if why or self.drains is None:
            raise FailedPrecondition(f"recommendation {rec.id} is to drain node {rec.node}, but {why}")
        if rec.state != "proposed":
            raise FailedPrecondition(f"recommendation {rec.id} is {rec.state}, not proposed")
        return self.drains

    async def wait(self, started: Started, timeout: float) -> None:
        """Return when the agent has answered (or the drain ended) and the outcome is stored, or
        `timeout` passed."""
        rec = started.recommendation
        if rec is not None and rec.action == "drain" and self.drains is not None:
            await self.drains.wait(started, timeout)
        else:
            await super().wait(started, timeout)

    def _evidence(self, node: str, profile: str) -> list[str]:
        """The active findings on `node` whose cause `profile` fixes."""
        out = []
        for stored in self._active():
            entry = self.know.causes.get(stored.finding.cause)
            if stored.active and stored.finding.node == node and entry and profile in profiles_for(entry):
                out.append(stored.id)
        return sorted(out)

    async def _refused(
        self,
        requester: str,
        node: str,
        params: dict[str, object],
        reason: str,
        exc: Exception,
        *,
        action: str = "retune",
    ) -> None:
        entry = await self.auditor.begin(requester, action, node, parameters=params, reason=reason)
        await self.auditor.outcome(entry, "refused", str(exc))
