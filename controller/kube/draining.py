"""Drains as the controller runs them (a part of KubeActions, controller/kube/actions.py): the
request checked, planned (pods it may not evict refuse it, naming them), audited and counted by the
breaker, stored, then run as a task (controller/kube/drain.py) that tells the breaker and the audit
entry how it ended. `load` resumes the drains a previous controller left running; `cancel` stops
them (their rows stay running)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from controller.errors import ControllerError, FailedPrecondition, InvalidMessage
from controller.kube.api import KubeApi
from controller.kube.checks import NodeChecks
from controller.kube.drain import DrainRun, Sleep
from controller.kube.pods import plan_pods
from controller.remediate.applying import BreakerRefused
from controller.remediate.guard import Verdict
from controller.store.drains import RUNNING, DrainRecord

log = logging.getLogger("gpufleet.controller.kube")
MAX_DRAIN_SECONDS = 24 * 3600.0


class Draining(NodeChecks):
    sleep: Sleep  # the drains' (tests make it move a fake clock)
    drains: dict[str, DrainRecord]  # node -> its newest drain this controller ran
    tasks: dict[str, asyncio.Task[DrainRecord]]  # drain id -> its task

    async def load(self) -> None:
        """Resume the drains a previous controller left running."""
        if not self.enabled:
            return
        for record in await self.store.load_running_drains():
            audit = await self.store.get_audit(record.audit_id) if record.audit_id else None
            verdict = None if audit is None else Verdict(True, "", record.breaker_action, audit)
            log.info("drain %s of %s: resumed (%s)", record.id, record.node, record.progress)
            self._run(self.cluster.require(), record, verdict)

    def cancel(self) -> None:
        """Stop the drains (a stopping controller): their rows stay running, resumed at next start."""
        for task in self.tasks.values():
            task.cancel()

    async def drain(
        self, node: str, *, requester: str, reason: str = "", dry_run: bool = False, timeout: float = 0.0
    ) -> DrainRecord:
        """Start draining `node` (or plan it: `dry_run`); the drain's record, running (or planned).
        NotFound, FailedPrecondition (no cluster, maintenance, busy, pods it may not evict),
        InvalidMessage (timeout) and BreakerRefused say why not, audited."""
        timeout = timeout or self.config.drain.timeout_seconds
        params: dict[str, Any] = {"dry_run": dry_run, "timeout_seconds": timeout}
        try:
            if not 0 < timeout <= MAX_DRAIN_SECONDS:
                raise InvalidMessage(f"timeout_seconds must be within 0..{MAX_DRAIN_SECONDS:.0f}")
            api = self.cluster.require()
            self._check_free(await self._node(api, node), node)
            pods = await self._call(api.pods_on, node)
            plan = await self._call(plan_pods, pods, self.config.drain, api.has_daemonset)
            if plan.refused:
                raise FailedPrecondition(plan.refusal(node))
        except ControllerError as exc:
            await self._refused(requester, "drain", node, exc, params=params, reason=reason)
            raise
        now = self.clock()
        record = DrainRecord(
            id=uuid.uuid4().hex[:12],
            node=node,
            state=RUNNING,
            started=now,
            updated=now,
            deadline=now + timeout,
            requester=requester,
            reason=reason,
            pending=plan.evict,
            terminating=plan.terminating,
            skipped=plan.skipped,
        )
        params["pods"] = len(plan.evict)
        if dry_run:
            entry = await self.auditor.begin(requester, "drain", node, parameters=params, reason=reason)
            record.state, record.audit_id = "planned", entry.id
            record.progress = f"dry run: would evict {len(plan.evict)} pod(s), skip {len(plan.skipped)}"
            await self.auditor.outcome(entry, "succeeded", record.progress)
            return record
        self.busy[node] = f"drain {record.id} is being started"
        try:
            verdict = await self.breaker.request("drain", node, requester, reason, parameters=params)
            if not verdict.allowed:
                raise BreakerRefused(verdict.why)
            record.breaker_action, record.audit_id = verdict.action_id, verdict.audit.id
            try:
                await self.store.save_drain(record)  # before it acts: a restart resumes it
            except Exception as exc:
                await self.breaker.finished(verdict, "failed", f"not started: {exc}")
                raise
        except BaseException:
            self.busy.pop(node, None)
            raise
        self._run(api, record, verdict)
        return record

    def _run(self, api: KubeApi, record: DrainRecord, verdict: Verdict | None) -> None:
        self.drains[record.node] = record
        self.busy[record.node] = f"drain {record.id} is running"
        run = DrainRun(
            api, record, self.config.drain, save=self.store.save_drain, clock=self.clock, sleep=self.sleep
        )
        task = asyncio.get_running_loop().create_task(self._drain(run, verdict))
        self.tasks[record.id] = task
        task.add_done_callback(lambda _: self.tasks.pop(record.id, None))

    async def _drain(self, run: DrainRun, verdict: Verdict | None) -> DrainRecord:
        record = run.record
        try:
            await run.run()
            if verdict is not None:
                outcome = "succeeded" if record.state == "drained" else "failed"
                await self.breaker.finished(verdict, outcome, f"{record.state}: {record.progress}")
        finally:
            if self.busy.get(record.node, "").startswith(f"drain {record.id}"):
                del self.busy[record.node]
        return record

    async def wait(self, record: DrainRecord, timeout: float) -> None:
        """Return when the drain ended (its outcome recorded) or `timeout` passed."""
        task = self.tasks.get(record.id)
        if task is not None:
            await asyncio.wait([task], timeout=timeout)

    async def latest(self, node: str) -> DrainRecord | None:
        """The node's newest drain: this controller's, else the store's."""
        record = self.drains.get(node)
        if record is not None:
            return record
        found = await self.store.list_drains(node, 1)
        return found[0] if found else None
