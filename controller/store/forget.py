"""Forgetting nodes in the store: every row about the node goes, except the audit log (what was done,
and to which node, stays on record) and the command, recommendation and drain history (pruned by
age on their own)."""

from __future__ import annotations

from collections.abc import Sequence

from controller.store.sql import Conn

NODE_TABLES = (
    ("nodes", "name"),
    ("boots", "node"),
    ("gpu_state", "node"),
    ("host_state", "node"),
    ("bmc_state", "node"),
    ("probe_results", "node"),
    ("probe_history", "node"),
    ("probe_series", "node"),
    ("findings", "node"),
    ("node_owners", "node"),
)


def forget_nodes(conn: Conn, names: Sequence[str]) -> int:
    """Delete the nodes' rows from the node tables; returns how many rows went."""
    removed = 0
    for table, column in NODE_TABLES:
        for name in names:
            removed += conn.execute(f"DELETE FROM {table} WHERE {column} = ?", (name,)).rowcount
    return removed
