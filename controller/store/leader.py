"""The `leader` row: the term of the controller that leads (controller/store/lease.py). A new lead
takes the next term number; a write that must come from the leader first checks that the store
still names its term (the fence a deposed leader cannot pass)."""

from __future__ import annotations

from controller.errors import NotLeader
from controller.store.sql import Conn


def begin_term(conn: Conn, holder: str, now: float) -> int:
    """Start the next term for `holder`; its number."""
    conn.execute(
        "INSERT INTO leader (id, epoch, holder, since) VALUES (1, 1, ?, ?) ON CONFLICT (id) DO UPDATE"
        " SET epoch = leader.epoch + 1, holder = excluded.holder, since = excluded.since",
        (holder, now),
    )
    return int(conn.execute("SELECT epoch FROM leader WHERE id = 1").fetchone()[0])


def check_term(conn: Conn, epoch: int) -> None:
    """NotLeader unless term `epoch` is still the store's."""
    row = conn.execute("SELECT epoch, holder, since FROM leader WHERE id = 1").fetchone()
    if row is None or int(row[0]) != epoch:
        now_leading = "no one" if row is None else f"term {row[0]} ({row[1]})"
        raise NotLeader(f"this controller's term {epoch} is over: {now_leading} leads the store now")


def current_term(conn: Conn) -> tuple[int, str, float] | None:
    row = conn.execute("SELECT epoch, holder, since FROM leader WHERE id = 1").fetchone()
    return None if row is None else (int(row[0]), str(row[1]), float(row[2]))
