"""A page of findings from the store, in the operator API's order (controller/paging.py): worst
first, then node, GPU (node-level first), cause and id; after a given key, at most `limit`."""

from __future__ import annotations

from collections.abc import Sequence

from controller.fleet.findings import StoredFinding
from controller.paging import SEVERITY_RANK, FindingKey
from controller.store.nodes import stored
from controller.store.sql import Conn

_RANK = (
    "CASE severity "
    + " ".join(f"WHEN '{name}' THEN {rank}" for name, rank in SEVERITY_RANK.items())
    + f" ELSE {len(SEVERITY_RANK)} END"
)
_ORDER = f"{_RANK}, node, coalesce(gpu, -1), cause, id"


def list_page(
    conn: Conn,
    node: str,
    include_resolved: bool,
    *,
    severities: Sequence[str] | None,
    after: FindingKey | None,
    limit: int,
    since: float | None = None,
) -> list[StoredFinding]:
    """Findings of `node` ('' every node) whose severity is one of `severities` (None: any), active only
    unless include_resolved, last seen at or after `since` (None: whenever), sorted, after the key
    `after` (None: from the start)."""
    sql = "SELECT id, first_seen, last_seen, active, body FROM findings WHERE 1 = 1"
    args: list[object] = []
    if node:
        sql += " AND node = ?"
        args.append(node)
    if not include_resolved:
        sql += " AND active = 1"
    if severities is not None:
        sql += f" AND severity IN ({', '.join('?' for _ in severities)})"
        args += severities
    if since is not None:
        sql += " AND last_seen >= ?"
        args.append(since)
    if after is not None:
        sql += f" AND ({_ORDER}) > (?, ?, ?, ?, ?)"
        args += after
    sql += f" ORDER BY {_ORDER} LIMIT ?"
    args.append(limit)
    return [stored(row) for row in conn.execute(sql, args)]
