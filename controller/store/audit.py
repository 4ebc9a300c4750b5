"""The audit log: every mutating request, written before acting, then its outcome.

One row per request (id), written with outcome `requested` before anything acts, and updated in
place with the outcome (`allowed`, `refused`, `succeeded`, `failed`, `rolled_back`), its time and a
detail (why refused, the error, the command id). The functions run in the store thread (see
writer.py); Store in sqlite.py is their async face.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from controller.store.sql import Conn

REQUESTED = "requested"
OUTCOMES = (REQUESTED, "allowed", "refused", "succeeded", "failed", "rolled_back")


@dataclass(slots=True)
class AuditEntry:
    id: str
    time: float
    requester: str  # operator:<peer>, policy, scheduler
    action: str  # probe_node, breaker_reset, retune, drain, ...
    node: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    findings: list[str] = field(default_factory=list)
    outcome: str = REQUESTED
    outcome_time: float | None = None
    detail: str = ""


COLUMNS = "id, time, requester, action, node, parameters, reason, findings, outcome, outcome_time, detail"


def add_entry(conn: Conn, e: AuditEntry) -> None:
    conn.execute(
        f"INSERT INTO audit ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            e.id,
            e.time,
            e.requester,
            e.action,
            e.node,
            json.dumps(e.parameters, sort_keys=True),
            e.reason,
            json.dumps(e.findings),
            e.outcome,
            e.outcome_time,
            e.detail,
        ),
    )


def set_outcome(conn: Conn, entry_id: str, outcome: str, when: float, detail: str) -> None:
    if outcome not in OUTCOMES:
        raise ValueError(f"audit outcome must be one of {', '.join(OUTCOMES)}, not {outcome!r}")
    updated = conn.execute(
        "UPDATE audit SET outcome = ?, outcome_time = ?, detail = ? WHERE id = ?",
        (outcome, when, detail, entry_id),
    ).rowcount
    if updated != 1:
        raise KeyError(f"no audit entry {entry_id!r}")


def _entry(row: tuple[Any, ...]) -> AuditEntry:
    eid, time, requester, action, node, parameters, reason, findings, outcome, outcome_time, detail = row
    return AuditEntry(
        id=str(eid),
        time=float(time),
        requester=str(requester),
        action=str(action),
        node=str(node),
        parameters=json.loads(parameters),
        reason=str(reason),
        findings=list(json.loads(findings)),
        outcome=str(outcome),
        outcome_time=None if outcome_time is None else float(outcome_time),
        detail=str(detail),
    )


def list_entries(conn: Conn, node: str, since: float | None, limit: int) -> list[AuditEntry]:
    """Newest first; optionally one node's, and only those requested at or after `since`."""
    sql = f"SELECT {COLUMNS} FROM audit WHERE 1 = 1"
    args: list[object] = []
    if node:
        sql += " AND node = ?"
        args.append(node)
    if since is not None:
        sql += " AND time >= ?"
        args.append(since)
    sql += " ORDER BY time DESC, id DESC LIMIT ?"
    args.append(limit)
    return [_entry(row) for row in conn.execute(sql, args)]


def get_entry(conn: Conn, entry_id: str) -> AuditEntry | None:
    row = conn.execute(f"SELECT {COLUMNS} FROM audit WHERE id = ?", (entry_id,)).fetchone()
    return None if row is None else _entry(row)


def save_breaker(conn: Conn, state: str, when: float) -> None:
    conn.execute(
        "INSERT INTO breaker (id, state, updated) VALUES (1, ?, ?) "
        "ON CONFLICT(id) DO UPDATE SET state = excluded.state, updated = excluded.updated",
        (state, when),
    )


def load_breaker(conn: Conn) -> str | None:
    row = conn.execute("SELECT state FROM breaker WHERE id = 1").fetchone()
    return None if row is None else str(row[0])
