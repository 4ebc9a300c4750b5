"""Tuning recommendations, as stored: one row per id, rewritten on every state change.

A row is a proposal built from active findings (controller/remediate/recommend.py) or an operator's
retune, and then its life: proposed -> approved -> applying -> verified | rolled_back | failed |
needs_attention. The row keeps what is needed to finish an apply after a controller restart: the
ApplyProfile command's id, the breaker action it holds and the audit entry it answers. The
functions run in the store thread (see writer.py); Store in sqlite.py is their async face.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from controller.store.rows import newest_rows
from controller.store.sql import Conn, upsert
from protos.gpufleet.v1 import telemetry_pb2 as pb

OPEN_STATES = ("proposed", "approved", "applying")
FINAL_STATES = ("verified", "rolled_back", "failed", "needs_attention")
STATES = OPEN_STATES + FINAL_STATES


@dataclass(slots=True)
class Change:
    setting: str  # gpu[3].power_limit, os.cpu_governor, bmc.bios.PcieAcsControl
    current: str  # from the node's latest readings; "unknown" where they do not say
    target: str
    pending_reboot: bool = False


@dataclass(slots=True)
class Recommendation:
    id: str
    node: str
    cause: str  # the finding cause it answers; "" for an operator's retune
    action: str  # tune, set_fleet_value, recommend_firmware, drain, investigate
    profile: str  # "" for drain and investigate
    state: str
    created: float
    updated: float
    policy: str = ""  # off | recommend | auto, as the policy said for the cause ("" for a retune)
    risk: str = ""  # online | needs_reboot; "" where nothing is applied (drain, investigate)
    finding_ids: list[str] = field(default_factory=list)
    gpus: list[int] = field(default_factory=list)  # the GPUs it touches; empty: the node
    changes: list[Change] = field(default_factory=list)
    targets: dict[str, Any] = field(default_factory=dict)  # ApplyProfile.targets_json, as sent
    expected_effect: str = ""
    detail: str = ""  # why it waits, failed or rolled back; what is pending
    requester: str = ""  # policy, operator:<peer>: who approved (or asked for) it
    reason: str = ""
    command_id: str = ""  # the ApplyProfile command, once applying
    breaker_action: str = ""  # the breaker's action id it holds while applying
    audit_id: str = ""  # the audit entry of the apply
    result: pb.ApplyProfileResult | None = None  # the agent's answer

    @property
    def open(self) -> bool:
        return self.state in OPEN_STATES


COLUMNS = "id, node, cause, profile, state, created, updated, command_id, body, result"
_IN_BODY = (
    "action",
    "policy",
    "risk",
    "finding_ids",
    "gpus",
    "changes",
    "targets",
    "expected_effect",
    "detail",
    "requester",
    "reason",
    "breaker_action",
    "audit_id",
)

Row = tuple[str, str, str, str, str, float, float, str, str, bytes | None]


def to_row(r: Recommendation) -> Row:
    """The row as it is now (taken on the event loop, written later in the store thread)."""
    body = {name: getattr(r, name) for name in _IN_BODY}
    body["changes"] = [asdict(c) for c in r.changes]
    return (
        r.id,
        r.node,
        r.cause,
        r.profile,
        r.state,
        r.created,
        r.updated,
        r.command_id,
        json.dumps(body, sort_keys=True),
        None if r.result is None else r.result.SerializeToString(),
    )


def from_row(row: tuple[Any, ...]) -> Recommendation:
    rid, node, cause, profile, state, created, updated, command_id, body, result = row
    fields = json.loads(body)
    fields["changes"] = [Change(**c) for c in fields.get("changes", [])]
    return Recommendation(
        id=str(rid),
        node=str(node),
        cause=str(cause),
        profile=str(profile),
        state=str(state),
        created=float(created),
        updated=float(updated),
        command_id=str(command_id),
        result=None if result is None else pb.ApplyProfileResult.FromString(result),
        **{name: fields[name] for name in _IN_BODY if name in fields},
    )


def save(conn: Conn, row: Row) -> None:
    conn.execute(upsert("recommendations", COLUMNS, "id"), row)


def delete(conn: Conn, rec_id: str) -> None:
    conn.execute("DELETE FROM recommendations WHERE id = ?", (rec_id,))


def list_rows(conn: Conn, node: str, limit: int) -> list[Recommendation]:
    """Newest first, optionally one node's."""
    return [
        from_row(row)
        for row in newest_rows(conn, "recommendations", COLUMNS, "created", node=node, limit=limit)
    ]


def load_all(conn: Conn) -> list[Recommendation]:
    """Every row, oldest first: what a starting controller takes up."""
    return [
        from_row(row) for row in conn.execute(f"SELECT {COLUMNS} FROM recommendations ORDER BY created, id")
    ]


def prune(conn: Conn, before: float) -> int:
    """Drop finished rows last changed before `before` (open ones stay, however old)."""
    marks = ", ".join("?" for _ in FINAL_STATES)
    return conn.execute(
        f"DELETE FROM recommendations WHERE state IN ({marks}) AND updated < ?", (*FINAL_STATES, before)
    ).rowcount
