"""probe_history: the log of every probe result that controllers from before probe_series wrote.

Nothing writes it since (nodes.save_frame keeps each key's newest results in probe_series), but a
store from then holds up to PROBE_HISTORY_DAYS of it until its rows age out: at 2,000 nodes probed
every half hour, 160 million rows. Its hourly prune was one `DELETE ... WHERE time < ?`, which no
index serves: it read the whole table in the store's one writing thread while every ack waited
(bench/history_prune.py). Now a prune reads the table a few nodes at a time, each its own job
through the index by node, so other work goes between; and once the table is empty, as in any
store written since, a prune costs one row's look.
"""

from __future__ import annotations

from collections.abc import Sequence

from controller.store.nodes import node_names
from controller.store.sql import Conn, placeholders

PRUNE_NODES = 4  # nodes whose logged rows one job reads: about 330,000 at 30 days of half-hourly probes


def nodes_logged(conn: Conn) -> list[str]:
    """The nodes whose rows a prune reads: none when probe_history is empty, else every node's (a
    forgotten node's rows went with it: forget.py)."""
    if conn.execute("SELECT 1 FROM probe_history LIMIT 1").fetchone() is None:
        return []
    return sorted(node_names(conn))


def prune(conn: Conn, nodes: Sequence[str], before: float) -> int:
    """Delete these nodes' rows older than `before`; how many went."""
    sql = f"DELETE FROM probe_history WHERE node IN ({placeholders(nodes)}) AND time < ?"
    return int(conn.execute(sql, (*nodes, before)).rowcount)
