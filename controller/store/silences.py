"""Acks, silences and maintenance in the store (tables silences, maintenance, finding_acks).

Silences are kept after they end (`gpufleet silences --all`); a node's maintenance row lives while
it is under maintenance; a finding's newest ack replaces the one before. The functions run in the
store thread (see writer.py); Store in sqlite.py is their async face.
"""

from __future__ import annotations

from typing import Any

from controller.fleet.findings import StoredFinding
from controller.fleet.silencing import Ack, Maintenance, Silence, Silencing
from controller.store.sql import Conn, upsert

SILENCE_COLUMNS = "id, node, cause, starts, ends, requester, comment, ended_by, end_comment"


def _silence(row: tuple[Any, ...]) -> Silence:
    sid, node, cause, starts, ends, by, comment, ended_by, end_comment = row
    return Silence(
        str(sid),
        str(node),
        str(cause),
        float(starts),
        float(ends),
        str(by),
        str(comment),
        str(ended_by),
        str(end_comment),
    )


def save_silence(conn: Conn, s: Silence) -> None:
    conn.execute(
        upsert("silences", SILENCE_COLUMNS, "id"),
        (s.id, s.node, s.cause, s.starts, s.ends, s.by, s.comment, s.ended_by, s.end_comment),
    )


def get_silence(conn: Conn, silence_id: str) -> Silence | None:
    row = conn.execute(f"SELECT {SILENCE_COLUMNS} FROM silences WHERE id = ?", (silence_id,)).fetchone()
    return None if row is None else _silence(row)


def list_silences(conn: Conn, node: str, include_expired: bool, now: float, limit: int) -> list[Silence]:
    """Newest first; optionally one node's; only those active at `now` unless include_expired."""
    sql = f"SELECT {SILENCE_COLUMNS} FROM silences WHERE 1 = 1"
    args: list[object] = []
    if node:
        sql += " AND node = ?"
        args.append(node)
    if not include_expired:
        sql += " AND starts <= ? AND ends > ?"
        args += [now, now]
    sql += " ORDER BY starts DESC, id LIMIT ?"
    args.append(limit)
    return [_silence(row) for row in conn.execute(sql, args)]


def set_maintenance(conn: Conn, node: str, m: Maintenance | None) -> None:
    """Put `node` under maintenance (m), or take it out (None)."""
    if m is None:
        conn.execute("DELETE FROM maintenance WHERE node = ?", (node,))
        return
    conn.execute(
        upsert("maintenance", "node, requester, comment, since", "node"),
        (m.node, m.by, m.comment, m.since),
    )


def save_ack(conn: Conn, a: Ack) -> None:
    conn.execute(
        upsert("finding_acks", "finding_id, node, requester, comment, time", "finding_id"),
        (a.finding_id, a.node, a.by, a.comment, a.time),
    )


def get_finding(conn: Conn, finding_id: str) -> StoredFinding | None:
    """A finding of the store by id, active or resolved."""
    from controller.store.nodes import stored

    row = conn.execute(
        "SELECT id, first_seen, last_seen, active, body FROM findings WHERE id = ?", (finding_id,)
    ).fetchone()
    return None if row is None else stored(row)


def load(conn: Conn, now: float) -> Silencing:
    """What a starting controller takes up: the silences not yet over, maintenance, every ack."""
    book = Silencing()
    for row in conn.execute(f"SELECT {SILENCE_COLUMNS} FROM silences WHERE ends > ?", (now,)):
        silence = _silence(row)
        book.silences[silence.id] = silence
    for node, by, comment, since in conn.execute("SELECT node, requester, comment, since FROM maintenance"):
        book.maintenance[node] = Maintenance(str(node), str(by), str(comment), float(since))
    for fid, node, by, comment, time in conn.execute(
        "SELECT finding_id, node, requester, comment, time FROM finding_acks"
    ):
        book.acks[fid] = Ack(str(fid), str(node), str(by), str(comment), float(time))
    return book
