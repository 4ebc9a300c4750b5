"""Operator RPCs: AckFinding, Silence, ListSilences, Unsilence, SetMaintenance.

Each mutating call is written to the audit log (actions "ack", "silence", "unsilence",
"maintenance") before it changes anything, and a refusal (unknown node, finding or silence, a bad
duration or cause) is recorded as its outcome. The decisions (what a silence covers, expiry) are in
controller/fleet/silencing.py; `mark` sets a Finding's ack and silenced_by wherever the operator
API returns findings.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import TYPE_CHECKING, Any, NoReturn

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from controller.errors import InvalidMessage, NotFound
from controller.fleet.findings import StoredFinding
from controller.fleet.silencing import Ack, Maintenance, Silence, silence_error
from controller.operator.wire import finding_to_proto
from controller.security.auth import caller
from controller.store.audit import AuditEntry
from protos.gpufleet.v1 import findings_pb2, operator_pb2
from protos.names import cause_name

if TYPE_CHECKING:
    from controller.app import ControllerApp

LIST_SILENCES_MAX = 10_000
Context = grpc.aio.ServicerContext[Any, Any]


def _ts(unix_seconds: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(unix_seconds * 1e9))
    return ts


def mark(msg: findings_pb2.Finding, app: ControllerApp) -> findings_pb2.Finding:
    """Set the finding's ack (its newest, if any) and, while it is active, what silences it now."""
    ack = app.silencing.acks.get(msg.id)
    if ack is not None:
        msg.ack.CopyFrom(findings_pb2.FindingAck(by=ack.by, comment=ack.comment, time=_ts(ack.time)))
    if msg.active:
        msg.silenced_by = app.silencing.silenced_by(msg.node, cause_name(msg.cause), app.clock())
    return msg


def silence_to_proto(s: Silence, now: float) -> operator_pb2.SilenceInfo:
    return operator_pb2.SilenceInfo(
        id=s.id,
        node=s.node,
        cause=s.cause,
        starts=_ts(s.starts),
        ends=_ts(s.ends),
        by=s.by,
        comment=s.comment,
        active=s.active(now),
    )


class SilencesApi:
    """Mixed into OperatorServicer (which sets self.app)."""

    app: ControllerApp

    async def _refuse(self, entry: AuditEntry, error: Exception) -> NoReturn:
        await self.app.audit.outcome(entry, "refused", str(error))
        raise error

    async def _finding(self, finding_id: str) -> StoredFinding | None:
        found = next((s for s in self.app.active.values() if s.id == finding_id), None)
        return found if found is not None or not finding_id else await self.app.store.get_finding(finding_id)

    async def AckFinding(
        self, request: operator_pb2.AckFindingRequest, context: Context
    ) -> findings_pb2.Finding:
        stored = await self._finding(request.finding_id)
        requester = caller(context)
        node = "" if stored is None else stored.finding.node
        entry = await self.app.audit.begin(
            requester, "ack", node, reason=request.comment, findings=[request.finding_id]
        )
        if stored is None:
            await self._refuse(entry, NotFound(f"no finding {request.finding_id!r}"))
        ack = Ack(stored.id, node, requester, request.comment, self.app.clock())
        await self.app.store.save_ack(ack)
        self.app.silencing.acks[stored.id] = ack
        await self.app.audit.outcome(
            entry, "succeeded", f"finding {stored.id} ({stored.finding.cause}) acked"
        )
        return mark(finding_to_proto(stored), self.app)

    async def Silence(
        self, request: operator_pb2.SilenceRequest, context: Context
    ) -> operator_pb2.SilenceInfo:
        requester = caller(context)
        params = {"cause": request.cause, "duration_seconds": request.duration_seconds}
        entry = await self.app.audit.begin(
            requester, "silence", request.node, parameters=params, reason=request.comment
        )
        why = (
            "node is required" if not request.node else silence_error(request.cause, request.duration_seconds)
        )
        if why:
            await self._refuse(entry, InvalidMessage(why))
        if request.node not in self.app.fleet.nodes:
            await self._refuse(entry, NotFound(f"node {request.node!r} is not known to this controller"))
        now = self.app.clock()
        silence = Silence(
            id=uuid.uuid4().hex[:12],
            node=request.node,
            cause=request.cause,
            starts=now,
            ends=now + request.duration_seconds,
            by=requester,
            comment=request.comment,
        )
        await self.app.store.save_silence(silence)
        self.app.silencing.add(silence, now)
        what = request.cause or "every cause"
        await self.app.audit.outcome(
            entry, "succeeded", f"silence {silence.id}: {what} for {request.duration_seconds:.0f} s"
        )
        return silence_to_proto(silence, now)

    async def ListSilences(
        self, request: operator_pb2.ListSilencesRequest, context: Context
    ) -> operator_pb2.ListSilencesResponse:
        now = self.app.clock()
        found = await self.app.store.list_silences(
            request.node, request.include_expired, now, LIST_SILENCES_MAX
        )
        return operator_pb2.ListSilencesResponse(silences=[silence_to_proto(s, now) for s in found])

    async def Unsilence(
        self, request: operator_pb2.UnsilenceRequest, context: Context
    ) -> operator_pb2.SilenceInfo:
        silence = self.app.silencing.silences.get(request.id)
        if silence is None and request.id:
            silence = await self.app.store.get_silence(request.id)
        requester = caller(context)
        node = "" if silence is None else silence.node
        entry = await self.app.audit.begin(
            requester, "unsilence", node, parameters={"id": request.id}, reason=request.comment
        )
        if silence is None:
            await self._refuse(entry, NotFound(f"no silence {request.id!r}"))
        now = self.app.clock()
        if silence.ends <= now:
            await self.app.audit.outcome(entry, "succeeded", f"silence {silence.id} was already over")
            return silence_to_proto(silence, now)
        ended = dataclasses.replace(silence, ends=now, ended_by=requester, end_comment=request.comment)
        await self.app.store.save_silence(ended)
        self.app.silencing.silences[ended.id] = ended
        await self.app.audit.outcome(entry, "succeeded", f"silence {ended.id} ended")
        return silence_to_proto(ended, now)

    async def SetMaintenance(
        self, request: operator_pb2.SetMaintenanceRequest, context: Context
    ) -> operator_pb2.NodeActionResponse:
        node = request.node
        requester = caller(context)
        entry = await self.app.audit.begin(
            requester, "maintenance", node, parameters={"on": request.on}, reason=request.comment
        )
        if node not in self.app.fleet.nodes:
            await self._refuse(entry, NotFound(f"node {node!r} is not known to this controller"))
        current = self.app.silencing.maintenance.get(node)
        changed = request.on != (current is not None)
        if request.on and current is not None:
            detail = f"node {node} is already under maintenance (by {current.by})"
        elif request.on:
            now = self.app.clock()
            entered = Maintenance(node, requester, request.comment, now)
            await self.app.store.set_maintenance(node, entered)
            self.app.silencing.maintenance[node] = entered
            detail = f"node {node} is under maintenance: its findings are silenced, no action is taken on it"
        elif current is not None:
            await self.app.store.set_maintenance(node, None)
            del self.app.silencing.maintenance[node]
            detail = f"node {node} is out of maintenance"
        else:
            detail = f"node {node} was not under maintenance"
        await self.app.audit.outcome(entry, "succeeded", detail)
        return operator_pb2.NodeActionResponse(node=node, changed=changed, detail=detail, audit_id=entry.id)
