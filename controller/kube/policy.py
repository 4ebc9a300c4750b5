"""The drain policy per cause (`kubernetes.policy`: off | recommend | auto, default recommend), the
Kubernetes half of drain recommendations: the Tuner keeps the rows in step with the findings
(controller/remediate/retune.py), this starts their drains and makes the rows follow them.

- `start` begins the drain a row recommends (an operator's `approve`, or the policy) through
  KubeActions.drain: audited, breaker-counted, refused as `gpufleet drain` would be. The row turns
  `applying` with the drain's id (in its command_id), audit entry and breaker action.
- `after_pass` starts the policy's approved rows (`auto`) when the node is free (no action holding
  it, no mutating command in flight, not under someone else's maintenance or cordon) and the breaker
  has budget: like an automatic apply, it waits rather than trip the breaker. A drain refused at its
  start (pods it may not evict, a node the cluster lacks) fails its row.
- Each applying row follows its drain: `verified` when drained, `failed` when the drain failed,
  `needs_attention` when it ended blocked or timed out, with the drain's outcome in the detail.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from controller.errors import ControllerError
from controller.kube import nodes
from controller.kube.actions import KubeActions
from controller.kube.api import ApiError
from controller.kube.cluster import NO_CLUSTER
from controller.remediate.applying import BreakerRefused, Started
from controller.remediate.retune import Tuner
from controller.store.commands import CommandRecord
from controller.store.drains import RUNNING, DrainRecord
from controller.store.recommendations import Recommendation
from protos.gpufleet.v1 import telemetry_pb2 as pb

log = logging.getLogger("gpufleet.controller.kube")
DRAIN = "drain"  # the recommendation's action, and the kind of the command record it answers with
ROW_STATES = {"drained": "verified", "failed": "failed"}  # blocked, timed_out: needs_attention
RECENT_DRAINS = 50  # a node's drains searched for a row's own


class DrainPolicy:
    """The drains of drain recommendations (the Tuner's `drains`)."""

    def __init__(self, kube: KubeActions, tuner: Tuner, clock: Callable[[], float]) -> None:
        self.kube = kube
        self.tuner = tuner
        self.clock = clock

    def unavailable(self) -> str:
        """Why no drain can be started at all ("" when a cluster is configured)."""
        return "" if self.kube.enabled else (self.kube.cluster.why or NO_CLUSTER)

    async def start(self, rec: Recommendation, requester: str, reason: str) -> Started:
        """Start the drain `rec` recommends; ControllerError (audited by the drain) says why not."""
        try:
            record = await self.kube.drain(rec.node, requester=requester, reason=reason)
        except BreakerRefused as exc:
            await self._save(rec, rec.state, f"the breaker refused it: {exc}")
            raise
        rec.command_id, rec.audit_id, rec.breaker_action = record.id, record.audit_id, record.breaker_action
        rec.requester, rec.reason, rec.result = requester, reason, None
        await self._save(rec, "applying", f"drain {record.id}: running")
        log.info("node %s: draining for recommendation %s (%s, %s)", rec.node, rec.id, rec.cause, requester)
        return Started(as_command(record), record.audit_id, rec)

    async def wait(self, started: Started, timeout: float) -> None:
        """Return when the drain ended (the row settled) or `timeout` passed."""
        rec = started.recommendation
        record = None if rec is None else await self._drain_of(rec)
        if rec is None or record is None:
            return
        await self.kube.wait(record, timeout)
        await self._follow(rec)
        started.command = as_command(record)

    async def after_pass(self) -> None:
        """Start the approved drains that may start now; the applying rows follow their drains."""
        rows = sorted((r for r in self.tuner.recs.values() if r.action == DRAIN), key=lambda r: r.created)
        for rec in rows:
            if rec.state == "approved":
                await self._auto(rec)
            elif rec.state == "applying":
                await self._follow(rec)

    async def _auto(self, rec: Recommendation) -> None:
        why = await self.not_now(rec.node)
        if not why:
            try:
                await self.start(rec, rec.requester or "policy", rec.reason)
                return
            except BreakerRefused as exc:  # another request took the last slot meanwhile
                why = f"the breaker refused it: {exc}"
            except ControllerError as exc:
                await self._save(rec, "failed", f"not started: {exc}")
                return
        if rec.detail != f"waiting: {why}":
            await self._save(rec, rec.state, f"waiting: {why}")

    async def not_now(self, node: str) -> str:
        """Why the policy's drain of `node` must wait ("" if it may start now)."""
        why = self.unavailable()
        if why:
            return why
        holder = self.kube.busy.get(node)
        if holder:
            return f"node {node} is busy: {holder}"
        command = self.kube.channel.mutating_holder(node)
        if command is not None:
            return f"node {node} has a mutating command in flight: {command.id} ({command.kind})"
        try:
            obj = await asyncio.to_thread(self.kube.cluster.require().get_node, node)
        except ApiError as exc:  # 404: the drain itself refuses it, failing the row
            return "" if exc.status == 404 else f"cannot check node {node} on Kubernetes ({exc})"
        mark = nodes.maintenance_mark(obj, self.kube.config.maintenance)
        if mark:
            return f"node {node} is under someone else's maintenance ({mark})"
        if nodes.cordoned_by(obj) == "other":
            return f"node {node} is cordoned by someone else"
        return self.kube.breaker.wait_reason(node)

    async def _follow(self, rec: Recommendation) -> None:
        record = await self._drain_of(rec)
        if record is None:
            await self._save(rec, "failed", f"drain {rec.command_id or '(none)'} is not in the store")
        elif record.open:
            detail = f"drain {record.id}: {record.progress or RUNNING}"
            if rec.detail != detail:
                await self._save(rec, rec.state, detail)
        else:
            state = ROW_STATES.get(record.state, "needs_attention")
            await self._save(rec, state, f"drain {record.id}: {record.progress}")  # "drained: ..."
            log.log(
                logging.INFO if state == "verified" else logging.WARNING,
                "node %s: drain %s for recommendation %s ended %s",
                rec.node,
                record.id,
                rec.id,
                record.state,
            )

    async def _drain_of(self, rec: Recommendation) -> DrainRecord | None:
        record = self.kube.drains.get(rec.node)
        if record is not None and record.id == rec.command_id:
            return record
        found = await self.kube.store.list_drains(rec.node, RECENT_DRAINS)
        return next((r for r in found if r.id == rec.command_id), None)

    async def _save(self, rec: Recommendation, state: str, detail: str) -> None:
        rec.state, rec.detail, rec.updated = state, detail, self.clock()
        self.tuner.recs[rec.id] = rec
        await self.tuner.store.save_recommendation(rec)


def as_command(record: DrainRecord) -> CommandRecord:
    """A drain as the command record `approve` answers with: its id, its state, and the outcome
    as the error when it ended other than drained."""
    ended = not record.open
    state = ("succeeded" if record.state == "drained" else "failed") if ended else "running"
    return CommandRecord(
        id=record.id,
        node=record.node,
        kind=DRAIN,
        requester=record.requester,
        created=record.started,
        deadline=record.deadline,
        command=pb.Command(id=record.id),
        state=state,
        finished=record.updated if ended else None,
        error=f"drain {record.id}: {record.progress}" if state == "failed" else "",
    )
