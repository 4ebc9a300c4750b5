"""`gpufleet node NAME --history [--since D]`: one node's health history, oldest first.

The timeline merges the node's findings (each opens at its first_seen and, once inactive, resolves
at its last_seen: ListFindings with resolved and silenced findings, seen since D) with its audit
entries since D (acks, silences, retunes, drains, ...). Findings are listed whole: one that was open
at D shows its opening even when that came before D.

JSON/YAML: {"node": NAME, "since": RFC 3339 or null, "events": [...]}, each event with "time"
(RFC 3339) and "kind": "finding_opened" or "finding_resolved" (finding_id, gpu, cause, severity,
summary, evidence, remediation) or "audit" (the entry as `gpufleet history -o json` prints it).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from rich.table import Table

from controller.cli import finding_view, tables
from controller.cli.history import entry_to_dict
from controller.cli.jsonify import finding_to_dict
from controller.cli.layout import Cell, Col, clean, make_table, plain, show
from controller.cli.operator import TIMEOUT_S, OperatorError, all_pages, call_operator
from controller.cli.output import DOCUMENT_FORMATS, print_document
from controller.cli.since import set_since
from protos.gpufleet.v1 import findings_pb2, operator_pb2, operator_pb2_grpc

AUDIT_LIMIT = 1000  # newest audit entries asked for; more is said on stderr
KIND_ORDER = {"finding_opened": 0, "audit": 1, "finding_resolved": 2}  # at the same instant


@dataclass(frozen=True)
class Event:
    """One entry of the timeline: a finding opening or resolving, or an audit entry."""

    time: Timestamp
    kind: str  # finding_opened | finding_resolved | audit
    finding: findings_pb2.Finding | None = None
    entry: operator_pb2.AuditEntry | None = None

    @property
    def order(self) -> tuple[int, int, int, str]:
        ident = self.entry.id if self.entry is not None else self.finding.id if self.finding else ""
        return (self.time.seconds, self.time.nanos, KIND_ORDER[self.kind], ident)


def timeline(
    findings: Sequence[findings_pb2.Finding], entries: Sequence[operator_pb2.AuditEntry]
) -> list[Event]:
    """Findings opening and resolving and the audit entries, merged by time, newest last."""
    events = [Event(f.first_seen, "finding_opened", finding=f) for f in findings]
    events += [Event(f.last_seen, "finding_resolved", finding=f) for f in findings if not f.active]
    events += [Event(e.time, "audit", entry=e) for e in entries]
    return sorted(events, key=lambda e: e.order)


def event_to_dict(event: Event) -> dict[str, Any]:
    out: dict[str, Any] = {"time": event.time.ToJsonString(), "kind": event.kind}
    if event.entry is not None:
        entry = entry_to_dict(event.entry)
        entry.pop("time", None)
        out.update(entry)
    elif event.finding is not None:
        f = finding_to_dict(event.finding)
        out.update(
            finding_id=f["id"],
            gpu=f["gpu"],
            cause=f.get("cause"),
            severity=f.get("severity"),
            summary=f.get("summary", ""),
            evidence=finding_view.evidence_line(event.finding.evidence),
            remediation=f.get("remediation", ""),
        )
    return out


def when(ts: Timestamp) -> str:
    return datetime.fromtimestamp(ts.seconds, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _row(event: Event) -> Sequence[Cell]:
    if event.entry is not None:
        e = event.entry
        what = f"{e.action} {e.outcome}".strip()
        detail = "; ".join(p for p in (e.reason, e.detail) if p) or "-"
        return (when(event.time), "audit", "-", what, e.requester or "-", detail)
    f = event.finding
    assert f is not None
    cause = tables.cause_name(f.cause)
    severity = tables.severity_name(f.severity)
    if event.kind == "finding_opened":
        label = plain("opened", style=tables.SEVERITY_STYLE.get(severity, ""))
        detail = finding_view.evidence_cell(f)
    else:
        label = plain("resolved", style="green")
        open_for = max(0, f.last_seen.seconds - f.first_seen.seconds)
        detail = f"after {finding_view.duration(open_for)}"
    return (when(event.time), label, tables.gpu_label(f), f"{cause} ({severity})", f.id, detail)


def history_table(name: str, events: Sequence[Event], *, wide: bool = False) -> Table:
    columns = (
        Col("TIME", key=True),
        Col("EVENT", key=True),
        Col("GPU", key=True),
        Col("WHAT", key=True),
        Col("BY / FINDING", drop=2),
        Col("DETAIL", drop=1, wrap=True),
    )
    return make_table(f"History of {name}", columns, [_row(e) for e in events], wide=wide)


def fetch(
    target: str, name: str, since: Timestamp | None
) -> tuple[list[findings_pb2.Finding], list[operator_pb2.AuditEntry]]:
    """The node's findings (resolved and silenced included) and audit entries, since `since`."""

    def ask(
        stub: operator_pb2_grpc.OperatorStub,
    ) -> tuple[list[findings_pb2.Finding], list[operator_pb2.AuditEntry]]:
        def page(token: str) -> operator_pb2.ListFindingsResponse:
            request = operator_pb2.ListFindingsRequest(
                node=name, include_resolved=True, include_silenced=True, page_token=token
            )
            if since is not None:
                request.since.CopyFrom(since)
            return stub.ListFindings(request, timeout=TIMEOUT_S)

        found = [f for p in all_pages(page) for f in p.findings]
        audit = operator_pb2.ListAuditRequest(node=name, limit=AUDIT_LIMIT)
        if since is not None:
            audit.since.CopyFrom(since)
        entries = list(stub.ListAudit(audit, timeout=TIMEOUT_S).entries)
        if not found and not entries:  # a node with no history, or a name nobody knows?
            stub.GetNode(operator_pb2.GetNodeRequest(name=name), timeout=TIMEOUT_S)
        return found, entries

    try:
        return call_operator(target, ask)
    except OperatorError as exc:
        if exc.code == grpc.StatusCode.NOT_FOUND:
            raise OperatorError(f"node {name} not found") from None
        raise


def node_history(target: str, name: str, output: str, since: str = "") -> int:
    """Print the node's history; exit 0, 1 (no controller, unknown node) or 2 (a bad --since)."""
    start: Timestamp | None = None
    if since:
        start = Timestamp()
        if not set_since(start, since):
            return 2
    try:
        found, entries = fetch(target, name, start)
    except OperatorError as exc:
        print(f"gpufleet: {clean(str(exc))}", file=sys.stderr)
        return 1
    if len(entries) >= AUDIT_LIMIT:
        print(
            f"gpufleet: only the newest {AUDIT_LIMIT} audit entries are shown; narrow --since",
            file=sys.stderr,
        )
    events = timeline(found, entries)
    if output in DOCUMENT_FORMATS:
        doc = {
            "node": name,
            "since": start.ToJsonString() if start is not None else None,
            "events": [event_to_dict(e) for e in events],
        }
        print_document(doc, output)
    else:
        show(history_table(name, events, wide=output == "wide"))
    return 0
