"""Operator service: the fleet as operators see it, probes on request, the commands sent to
agents, the breaker, the audit log, tuning (recommendations, retune, approve: app.tuning) and the
Kubernetes node actions (cordon, uncordon, drain: app.kube). Thin: reads app state, converts to the
wire. Every request that acts
(ProbeNode, ResetBreaker, Retune, Approve, Cordon, Uncordon, Drain) is written to the audit log
before it acts."""

from __future__ import annotations

import heapq
import json
from typing import Any

import grpc

from controller.app import ControllerApp
from controller.commands.kinds import CommandKind
from controller.errors import InvalidMessage, NotFound
from controller.fleet.findings import StoredFinding, by_node
from controller.fleet.health import node_health
from controller.fleet.model import NodeState
from controller.fleet.node_order import names_after
from controller.fleet.probe_index import node_probes
from controller.kube.wire import drain_to_proto, kube_view
from controller.operator.recording import RecordApi
from controller.operator.silences import SilencesApi, mark
from controller.operator.wire import _ts, finding_to_proto
from controller.paging import (
    ENTRY_FRAMING_BYTES,
    FINDINGS,
    NODES,
    PAGE_BYTES,
    SEVERITY_RANK,
    SUMMARY_FIXED_BYTES,
    encode,
    finding_after,
    finding_key,
    node_after,
    page_size,
)
from controller.remediate.applying import BreakerRefused, Started
from controller.remediate.guard import Status
from controller.security.auth import caller
from controller.security.warning import security_warning
from controller.store.audit import AuditEntry
from controller.store.commands import STATES, CommandRecord
from controller.store.recommendations import Recommendation
from protos.gpufleet.v1 import operator_pb2, operator_pb2_grpc
from protos.gpufleet.v1 import telemetry_pb2 as pb
from protos.names import severity_name, severity_value

PROBE_WAIT_DEFAULT_SECONDS = 120.0  # ProbeNode with wait and no timeout
PROBE_WAIT_MAX_SECONDS = 3600.0
LIST_COMMANDS_DEFAULT = 100
LIST_COMMANDS_MAX = 10_000
LIST_AUDIT_DEFAULT = 100
LIST_AUDIT_MAX = 10_000
LIST_RECOMMENDATIONS_DEFAULT = 100
LIST_RECOMMENDATIONS_MAX = 10_000
RETUNE_WAIT_MAX_SECONDS = 3600.0
DRAIN_WAIT_MARGIN_SECONDS = 5.0  # a waiting Drain returns this long after the drain's own deadline
COMMAND_STATES = {name: operator_pb2.CommandState.Value(f"COMMAND_STATE_{name.upper()}") for name in STATES}


class OperatorServicer(SilencesApi, RecordApi, operator_pb2_grpc.OperatorServicer):
    def __init__(self, app: ControllerApp) -> None:
        self.app = app
        # Each node's summary fields read from its Hello (replaced when the agent says hello again,
        # never changed in place), kept with it: reading them out of the message was a third of a
        # summary's time.
        self._from_hello: dict[str, tuple[pb.Hello, dict[str, Any], int]] = {}

    def _findings_of(self, node: str) -> list[StoredFinding]:
        return [s for key, s in self.app.active.items() if key[0] == node]

    def _summary(
        self, node: NodeState, active: list[StoredFinding] | None = None
    ) -> operator_pb2.NodeSummary:
        summary = operator_pb2.NodeSummary(**self._summary_fields(node, active, self.app.clock()))
        summary.last_seen.FromNanoseconds(int(node.last_seen * 1e9))
        return summary

    def _summary_fields(
        self, node: NodeState, active: list[StoredFinding] | None, now: float
    ) -> dict[str, Any]:
        """A NodeSummary's fields but last_seen (a message: set in place). `active`: the node's active
        findings when the caller has them grouped (else looked up). Health and the count leave
        silenced findings out (and so every finding of a node under maintenance): what needs an
        operator's attention; `node NAME` still lists them, marked."""
        mine = self._findings_of(node.name) if active is None else active
        findings = self.app.silencing.unsilenced(mine, now) if mine else mine
        maintenance = self.app.silencing.maintenance.get(node.name)
        return {
            **self._hello_fields(node),
            "connected": node.connected,
            "acked_seq": self.app.fleet.acked.get((node.name, node.hello.boot_id), 0),
            "health": node_health(node, findings, now, self.app.config.stale_after_seconds),
            "active_findings": len(findings),
            "transport": self.app.identity.transports.get(node.name, ""),
            "maintenance": maintenance is not None,
            "maintenance_comment": "" if maintenance is None else maintenance.comment,
        }

    def _hello_fields(self, node: NodeState) -> dict[str, Any]:
        return self._from_hello_of(node)[1]

    def _from_hello_of(self, node: NodeState) -> tuple[pb.Hello, dict[str, Any], int]:
        """The summary fields read from the node's Hello, and the bytes of their strings."""
        kept = self._from_hello.get(node.name)
        if kept is not None and kept[0] is node.hello:
            return kept
        if len(self._from_hello) > 2 * len(self.app.fleet.nodes):  # forgotten nodes': dropped
            self._from_hello = {n: k for n, k in self._from_hello.items() if n in self.app.fleet.nodes}
        hello = node.hello
        fields = {
            "name": node.name,
            "boot_id": hello.boot_id,
            "agent_version": hello.agent_version,
            "gpu_count": len(hello.inventory.gpus),
            "gpu_model": node.gpu_model,
            "source": hello.inventory.source,
        }
        size = sum(len(v.encode()) for v in fields.values() if isinstance(v, str))
        kept = self._from_hello[node.name] = (hello, fields, size)
        return kept

    async def ListNodes(
        self, request: operator_pb2.ListNodesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> operator_pb2.ListNodesResponse:
        size = page_size(request.page_size, self.app.config.limits.node_page_size)
        after = node_after(request.page_token)
        known = self.app.fleet.nodes
        names = names_after(self.app.fleet, after, size + 1)
        grouped = by_node(self.app.active)
        response = operator_pb2.ListNodesResponse(total=len(known), warning=security_warning(self.app.config))
        # Each summary made in its place in the answer: one made apart is copied in (at 12,500 nodes
        # a listing under load took 1.5 s, a third of it building the pages on the event loop).
        add, now, room, listed = response.nodes.add, self.app.clock(), PAGE_BYTES, 0
        for name in names[:size]:
            node = known[name]
            fields = self._summary_fields(node, grouped.get(name, []), now)
            room -= self._from_hello_of(node)[2] + len(fields["transport"]) + SUMMARY_FIXED_BYTES
            if fields["maintenance_comment"]:
                room -= len(fields["maintenance_comment"].encode())
            if room < 0 and listed:  # this one would pass the bytes a client takes: the next page's
                break
            add(**fields).last_seen.FromNanoseconds(int(node.last_seen * 1e9))
            listed += 1
        if listed < len(names):
            response.next_page_token = encode(NODES, (names[listed - 1],))
        return response

    async def GetNode(
        self, request: operator_pb2.GetNodeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> operator_pb2.NodeDetail:
        node = self.app.fleet.nodes.get(request.name)
        if node is None:
            raise NotFound(f"node {request.name!r} is not known to this controller")
        probes = sorted(
            node_probes(self.app.fleet, node.name),
            key=lambda r: (r.probe, r.variant, -1 if r.gpu is None else r.gpu),
        )
        detail = operator_pb2.NodeDetail(
            summary=self._summary(node),
            hello=node.hello,
            gpus=[node.gpus[i].sample for i in sorted(node.gpus)],
            probes=[r.result for r in probes],
            findings=[mark(finding_to_proto(s), self.app) for s in _ordered(self._findings_of(node.name))],
        )
        if node.host is not None:
            detail.host.CopyFrom(node.host)
        if node.bmc is not None:
            detail.bmc.CopyFrom(node.bmc)
        kube = await kube_view(self.app.kube, node.name)
        if kube is not None:
            detail.kubernetes.CopyFrom(kube)
        return detail

    async def ListFindings(
        self, request: operator_pb2.ListFindingsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> operator_pb2.ListFindingsResponse:
        size = page_size(request.page_size, self.app.config.limits.page_size)
        after = finding_after(request.page_token)
        floor = request.min_severity
        since = request.since.ToNanoseconds() / 1e9 if request.HasField("since") else None
        now = self.app.clock()

        def shown(s: StoredFinding) -> bool:  # silenced ones only on request
            return request.include_silenced or not self.app.silencing.is_silenced(s, now)

        found: list[StoredFinding]
        if request.include_resolved:
            severities = [n for n in SEVERITY_RANK if severity_value(n) >= floor] if floor else None
            found = []
            while len(found) <= size:  # a page and one more, or the end (silenced ones skipped)
                batch = await self.app.store.list_findings_page(
                    request.node, True, severities, after, size + 1, since=since
                )
                found += [s for s in batch if shown(s)]
                if len(batch) <= size:
                    break
                after = finding_key(batch[-1])
        else:
            found = heapq.nsmallest(
                size + 1,
                (
                    s
                    for key, s in self.app.active.items()
                    if (not request.node or key[0] == request.node)
                    and (not floor or severity_value(s.finding.severity) >= floor)
                    and (after is None or finding_key(s) > after)
                    and (since is None or s.last_seen >= since)
                    and shown(s)
                ),
                key=finding_key,
            )
        response = operator_pb2.ListFindingsResponse()
        room, last = PAGE_BYTES, None
        for stored in found[:size]:
            message = mark(finding_to_proto(stored), self.app)
            room -= message.ByteSize() + ENTRY_FRAMING_BYTES  # an acked comment has no length limit
            if room < 0 and last is not None:  # this one would pass the bytes a client takes
                break
            response.findings.append(message)
            last = stored
        if last is not None and len(response.findings) < len(found):
            response.next_page_token = encode(FINDINGS, finding_key(last))
        return response

    async def ProbeNode(
        self, request: operator_pb2.ProbeNodeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> operator_pb2.ProbeNodeResponse:
        timeout = request.timeout_seconds or PROBE_WAIT_DEFAULT_SECONDS
        if not 0 < timeout <= PROBE_WAIT_MAX_SECONDS:
            raise InvalidMessage(f"timeout_seconds must be within 0..{PROBE_WAIT_MAX_SECONDS:.0f}")
        if len(set(request.probes)) != len(request.probes) or len(set(request.gpus)) != len(request.gpus):
            raise InvalidMessage("name each probe and GPU once")
        # Without force the agent's own safety check refuses busy GPUs; the controller does not
        # second-guess an operator with its idle rule.
        run = pb.RunProbes(probes=request.probes, gpus=request.gpus, force=request.force)
        requester = caller(context)
        params = {"probes": list(request.probes), "gpus": list(request.gpus), "force": request.force}
        entry = await self.app.audit.begin(requester, "probe_node", request.node, parameters=params)
        try:
            command = await self.app.probing.send(request.node, run, "operator", requester=requester)
        except Exception as exc:
            await self.app.audit.outcome(entry, "refused", str(exc))
            raise
        await self.app.audit.outcome(entry, "allowed", f"command {command.id}")
        if request.wait:
            await self.app.probing.commands.wait(command, timeout)
            if command.answered:
                outcome = "succeeded" if command.ok else "failed"
                await self.app.audit.outcome(entry, outcome, f"command {command.id}: {command.error or 'ok'}")
        return operator_pb2.ProbeNodeResponse(
            command_id=command.id,
            done=command.answered,
            ok=command.ok,
            error=command.error,
            results=command.result_list(),
        )

    async def ListCommands(
        self, request: operator_pb2.ListCommandsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> operator_pb2.ListCommandsResponse:
        limit = request.limit or LIST_COMMANDS_DEFAULT
        if limit > LIST_COMMANDS_MAX:
            raise InvalidMessage(f"limit must be at most {LIST_COMMANDS_MAX}")
        records = await self.app.commands.list(request.node, limit)
        return operator_pb2.ListCommandsResponse(
            commands=[command_to_proto(r, self.app.commands.kinds) for r in records]
        )

    async def GetBreaker(
        self, request: operator_pb2.GetBreakerRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> operator_pb2.BreakerStatus:
        return breaker_to_proto(self.app.breaker.status())

    async def ResetBreaker(
        self, request: operator_pb2.ResetBreakerRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> operator_pb2.BreakerStatus:
        if not request.reason.strip():
            raise InvalidMessage("a reason is required to reset the breaker")
        await self.app.breaker.reset(caller(context), request.reason)
        return breaker_to_proto(self.app.breaker.status())

    async def ListAudit(
        self, request: operator_pb2.ListAuditRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> operator_pb2.ListAuditResponse:
        limit = request.limit or LIST_AUDIT_DEFAULT
        if limit > LIST_AUDIT_MAX:
            raise InvalidMessage(f"limit must be at most {LIST_AUDIT_MAX}")
        since = request.since.ToNanoseconds() / 1e9 if request.HasField("since") else None
        entries = await self.app.store.list_audit(request.node, since, limit)
        return operator_pb2.ListAuditResponse(entries=[audit_to_proto(e) for e in entries])

    async def ListRecommendations(
        self, request: operator_pb2.ListRecommendationsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> operator_pb2.ListRecommendationsResponse:
        limit = request.limit or LIST_RECOMMENDATIONS_DEFAULT
        if limit > LIST_RECOMMENDATIONS_MAX:
            raise InvalidMessage(f"limit must be at most {LIST_RECOMMENDATIONS_MAX}")
        recs = await self.app.tuning.recommendations(request.node, limit)
        return operator_pb2.ListRecommendationsResponse(
            recommendations=[recommendation_to_proto(r) for r in recs]
        )

    async def Retune(
        self, request: operator_pb2.RetuneRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> operator_pb2.RetuneResponse:
        timeout = self._apply_wait(request.timeout_seconds)
        if len(set(request.gpus)) != len(request.gpus):
            raise InvalidMessage("name each GPU once")
        try:
            started = await self.app.tuning.retune(
                request.node,
                request.profile,
                requester=caller(context),
                reason=request.reason,
                gpus=list(request.gpus),
                dry_run=request.dry_run,
            )
        except BreakerRefused as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        return await self._answer(started, request.wait, timeout)

    async def Approve(
        self, request: operator_pb2.ApproveRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> operator_pb2.RetuneResponse:
        timeout = self._apply_wait(request.timeout_seconds)
        try:
            started = await self.app.tuning.approve(
                request.id, requester=caller(context), reason=request.reason
            )
        except BreakerRefused as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        return await self._answer(started, request.wait, timeout)

    async def Cordon(
        self, request: operator_pb2.CordonRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> operator_pb2.NodeActionResponse:
        try:
            done, audit_id = await self.app.kube.cordon(
                request.node, requester=caller(context), reason=request.reason
            )
        except BreakerRefused as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        return operator_pb2.NodeActionResponse(
            node=request.node, changed=done.changed, detail=done.detail, audit_id=audit_id
        )

    async def Uncordon(
        self, request: operator_pb2.UncordonRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> operator_pb2.NodeActionResponse:
        done, audit_id = await self.app.kube.uncordon(
            request.node, requester=caller(context), reason=request.reason, force=request.force
        )
        return operator_pb2.NodeActionResponse(
            node=request.node, changed=done.changed, detail=done.detail, audit_id=audit_id
        )

    async def Drain(
        self, request: operator_pb2.DrainRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> operator_pb2.DrainStatus:
        try:
            record = await self.app.kube.drain(
                request.node,
                requester=caller(context),
                reason=request.reason,
                dry_run=request.dry_run,
                timeout=request.timeout_seconds,
            )
        except BreakerRefused as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        if request.wait and record.open:
            left = record.deadline - self.app.clock() + DRAIN_WAIT_MARGIN_SECONDS
            await self.app.kube.wait(record, max(left, DRAIN_WAIT_MARGIN_SECONDS))
        return drain_to_proto(record)

    def _apply_wait(self, requested: float) -> float:
        timeout = requested or self.app.commands.kinds["apply_profile"].timeout_seconds
        if not 0 < timeout <= RETUNE_WAIT_MAX_SECONDS:
            raise InvalidMessage(f"timeout_seconds must be within 0..{RETUNE_WAIT_MAX_SECONDS:.0f}")
        return timeout

    async def _answer(self, started: Started, wait: bool, timeout: float) -> operator_pb2.RetuneResponse:
        if wait:
            await self.app.tuning.wait(started, timeout)
        record = started.command
        msg = operator_pb2.RetuneResponse(
            command_id=record.id,
            audit_id=started.audit_id,
            recommendation_id="" if started.recommendation is None else started.recommendation.id,
            # A drain recommendation's answer is its drain (no agent result): done when it ended.
            done=record.result is not None or (record.kind == "drain" and not record.open),
            error=record.error,
        )
        if record.result is not None and record.result.HasField("apply_profile"):
            msg.result.CopyFrom(record.result.apply_profile)
        return msg


def recommendation_to_proto(r: Recommendation) -> operator_pb2.Recommendation:
    msg = operator_pb2.Recommendation(
        id=r.id,
        node=r.node,
        cause=r.cause,
        action=r.action,
        profile=r.profile,
        changes=[
            pb.SettingChange(
                setting=c.setting, current=c.current, target=c.target, pending_reboot=c.pending_reboot
            )
            for c in r.changes
        ],
        finding_ids=r.finding_ids,
        expected_effect=r.expected_effect,
        risk=r.risk,
        state=r.state,
        created=_ts(r.created),
        updated=_ts(r.updated),
        policy=r.policy,
        command_id=r.command_id,
        detail=r.detail,
        gpus=r.gpus,
    )
    if r.result is not None:
        msg.result.CopyFrom(r.result)
    return msg


def breaker_to_proto(status: Status) -> operator_pb2.BreakerStatus:
    state = status.state
    msg = operator_pb2.BreakerStatus(
        tripped=state.tripped,
        why=state.why,
        window_seconds=status.limits.window_seconds,
        share=status.limits.share,
        usage=[
            operator_pb2.BreakerUsage(scope=u.scope, size=u.size, limit=u.limit, used=u.used, nodes=u.nodes)
            for u in status.usage
        ],
        actions=[
            operator_pb2.BreakerAction(
                id=a.id, kind=a.kind, node=a.node, group=a.group, time=_ts(a.time), outcome=a.outcome
            )
            for a in state.actions
        ],
    )
    if state.tripped_at is not None:
        msg.tripped_at.CopyFrom(_ts(state.tripped_at))
    return msg


def audit_to_proto(e: AuditEntry) -> operator_pb2.AuditEntry:
    msg = operator_pb2.AuditEntry(
        id=e.id,
        time=_ts(e.time),
        requester=e.requester,
        action=e.action,
        node=e.node,
        parameters=json.dumps(e.parameters, sort_keys=True),
        reason=e.reason,
        finding_ids=e.findings,
        outcome=e.outcome,
        detail=e.detail,
    )
    if e.outcome_time is not None:
        msg.outcome_time.CopyFrom(_ts(e.outcome_time))
    return msg


def command_to_proto(record: CommandRecord, kinds: dict[str, CommandKind]) -> operator_pb2.CommandInfo:
    kind = kinds.get(record.kind)
    msg = operator_pb2.CommandInfo(
        id=record.id,
        node=record.node,
        kind=record.kind,
        state=COMMAND_STATES[record.state],
        requester=record.requester,
        created=_ts(record.created),
        deadline=_ts(record.deadline),
        error=record.error,
        command=record.command,
        mutating=kind is None or kind.mutating,
    )
    if record.sent is not None:
        msg.sent.CopyFrom(_ts(record.sent))
    if record.finished is not None:
        msg.finished.CopyFrom(_ts(record.finished))
    if record.result is not None:
        msg.result.CopyFrom(record.result)
    return msg


def _ordered(found: list[StoredFinding]) -> list[StoredFinding]:
    """Worst first, then by node and GPU, so a table reads top-down by urgency."""
    rank = {"critical": 0, "warning": 1, "info": 2}
    return sorted(
        found,
        key=lambda s: (
            rank.get(s.finding.severity, 3),
            s.finding.node,
            -1 if s.finding.gpu is None else s.finding.gpu,
            s.finding.cause,
        ),
    )


__all__ = ["OperatorServicer", "finding_to_proto", "severity_name"]
