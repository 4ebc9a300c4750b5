"""Which replica ingests each node (`replica_ingest`, controller/replicas.py): the node_owners rows.

A node belongs to the replica that holds its newest stream: a Hello takes the node (claim), from
whichever replica had it before, dead or alive. Every write of a node's rows first checks, in the
same transaction, that this replica still owns it (mark_written, which also records when the rows
were written). It takes the row's lock, so a replica that lost the node cannot write after the
taking replica's claim commits: its write fails with NotOwner and its stream ends. While that claim
is still open the write does not wait for it (on PostgreSQL): it fails at once with RowBusy. The leader
reads the nodes other replicas wrote since its last look (changed) and loads their rows.

Times are each replica's own clock: readers allow for skew between hosts (CHANGE_MARGIN_SECONDS).
"""

from __future__ import annotations

from collections.abc import Sequence

from controller.errors import NotOwner, RowBusy
from controller.store.sql import Conn, placeholders

CHANGE_MARGIN_SECONDS = 30.0  # rows written up to this long before a look are read again
CHUNK = 500  # nodes a statement names
CLAIM = (
    "INSERT INTO node_owners (node, holder, since, written) VALUES (?, ?, ?, ?) ON CONFLICT (node)"
    " DO UPDATE SET since = CASE WHEN node_owners.holder = excluded.holder THEN node_owners.since"
    " ELSE excluded.since END, holder = excluded.holder, written = excluded.written"
)


def claim(conn: Conn, node: str, holder: str, now: float) -> str | None:
    """`holder` owns `node` from now; the replica that owned it before, or None (none, or itself)."""
    row = conn.execute("SELECT holder FROM node_owners WHERE node = ?", (node,)).fetchone()
    conn.execute(CLAIM, (node, holder, now, now))
    return None if row is None or row[0] == holder else str(row[0])


def claim_all(conn: Conn, claims: Sequence[tuple[str, str, float]]) -> dict[str, str | None]:
    """claim for many (node, holder, now), each node once: the owner row of each read in one
    statement (per CHUNK) and all written in one executemany; node -> the replica that owned it
    before, or None."""
    nodes = [node for node, _, _ in claims]
    before: dict[str, str] = {}
    for start in range(0, len(nodes), CHUNK):
        chunk = nodes[start : start + CHUNK]
        sql = f"SELECT node, holder FROM node_owners WHERE node IN ({placeholders(chunk)})"
        before.update((str(n), str(h)) for n, h in conn.execute(sql, tuple(chunk)).fetchall())
    conn.executemany(CLAIM, [(node, holder, now, now) for node, holder, now in claims])
    return {node: None if before.get(node) in (None, holder) else before[node] for node, holder, _ in claims}


def mark_written(conn: Conn, node: str, holder: str, now: float, skip_locked: str = "") -> None:
    """Record that `holder` writes `node`'s rows now; NotOwner when another replica took the node.

    With `skip_locked` (the backend's), a row another replica's open transaction holds (its claim
    of the node, not committed yet) is not waited for: RowBusy at once. Waiting could close a circle
    (that transaction waiting in turn on a row this one holds, its write of a node this batch just
    claimed): PostgreSQL's deadlock, broken only after a second by aborting one of the two."""
    moved = conn.execute(
        "UPDATE node_owners SET written = ? WHERE node = "
        f"(SELECT node FROM node_owners WHERE node = ? AND holder = ?{skip_locked})",
        (now, node, holder),
    ).rowcount
    if moved == 0:
        row = conn.execute("SELECT holder FROM node_owners WHERE node = ?", (node,)).fetchone()
        if row is not None and str(row[0]) == holder:
            raise RowBusy(f"node {node}: its owner row is held by another replica's open transaction")
        raise NotOwner(node, None if row is None else str(row[0]))


def mark_owned(conn: Conn, nodes: Sequence[str], holder: str, now: float, skip_locked: str = "") -> bool:
    """Record that `holder` writes all of `nodes` now, in one statement: whether it could (it owns
    them all and no other replica's open transaction holds one; if not, the rows it did mark stay
    marked: the caller goes node by node, or rolls back)."""
    chunk = list(dict.fromkeys(nodes))
    moved = conn.execute(
        f"UPDATE node_owners SET written = ? WHERE node IN (SELECT node FROM node_owners WHERE node"
        f" IN ({placeholders(chunk)}) AND holder = ?{skip_locked})",
        (now, *chunk, holder),
    ).rowcount
    return bool(moved == len(chunk))


def mark_all_written(
    conn: Conn, nodes: Sequence[str], holder: str, now: float, skip_locked: str = ""
) -> tuple[set[str], int]:
    """mark_written for many nodes, one statement for each CHUNK of them while `holder` still owns
    them all (the usual case; it was one each): the nodes marked written, and how many of the
    others it owns but another replica's open transaction holds (mark_written's RowBusy); the rest
    another replica took (its NotOwner). A chunk with one of those goes node by node."""
    written: set[str] = set()
    busy = 0
    for start in range(0, len(nodes), CHUNK):
        chunk = list(dict.fromkeys(nodes[start : start + CHUNK]))
        if mark_owned(conn, chunk, holder, now, skip_locked):
            written.update(chunk)
            continue
        for node in chunk:  # (those the statement marked are marked again: the same time)
            try:
                mark_written(conn, node, holder, now, skip_locked)
            except NotOwner:
                continue
            except RowBusy:
                busy += 1
                continue
            written.add(node)
    return written, busy


def changed(conn: Conn, holder: str, since: float) -> dict[str, tuple[str, float]]:
    """The nodes other replicas than `holder` wrote after `since` (their clocks): node -> (owner,
    written)."""
    rows = conn.execute(
        "SELECT node, holder, written FROM node_owners WHERE written > ? AND holder <> ?", (since, holder)
    )
    return {str(node): (str(owner), float(written)) for node, owner, written in rows}


def owners(conn: Conn) -> dict[str, str]:
    """Every owned node's replica."""
    return {str(n): str(h) for n, h in conn.execute("SELECT node, holder FROM node_owners")}
