"""Drains, as stored: one row per drain, rewritten as it progresses (controller/kube/drain.py).

A row keeps everything a restarted controller needs to take the drain up where it was: the pods
still to evict (with their PDB backoff), the pods already evicted (never evicted again) and
whether they are gone, the pods skipped and why, the deadline, and the breaker action and audit
entry it answers. States: running, then drained | blocked | timed_out | failed. The functions run
in the store thread (see writer.py); Store in sqlite.py is their async face.
"""

from __future__ import annotations

import msgspec

from controller.store.rows import newest_rows
from controller.store.sql import Conn, upsert

RUNNING = "running"
OUTCOMES = ("drained", "blocked", "timed_out", "failed")
STATES = (RUNNING, *OUTCOMES)


class DrainPod(msgspec.Struct, kw_only=True):
    namespace: str
    name: str
    uid: str = ""
    why: str = ""  # skipped: why; refused: which setting allows it
    pdb: str = ""  # pending: the PodDisruptionBudget that refused its last eviction
    time: float = 0.0  # evicted: when the eviction was accepted
    gone: bool = False  # evicted or terminating: the pod has left the node
    attempts: int = 0  # pending: evictions refused so far (429)
    next_try: float = 0.0  # pending: not before this time (the PDB backoff)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class DrainRecord(msgspec.Struct, kw_only=True):
    id: str
    node: str
    state: str  # running, drained, blocked, timed_out, failed
    started: float
    updated: float
    deadline: float
    requester: str = ""
    reason: str = ""
    progress: str = ""  # one line: where it is ("blocked by PDB web")
    error: str = ""  # failed: the API error
    cordoned: bool = False  # gpufleet cordoned the node for this drain
    pending: list[DrainPod] = msgspec.field(default_factory=list)  # still to evict
    evicted: list[DrainPod] = msgspec.field(default_factory=list)  # eviction accepted
    terminating: list[DrainPod] = msgspec.field(default_factory=list)  # being deleted already: waited for
    skipped: list[DrainPod] = msgspec.field(default_factory=list)  # left on the node, with why
    breaker_action: str = ""
    audit_id: str = ""

    @property
    def open(self) -> bool:
        return self.state == RUNNING

    @property
    def blocking(self) -> list[DrainPod]:
        return [p for p in self.pending if p.pdb]

    @property
    def waiting(self) -> list[DrainPod]:
        """Evicted (or terminating) pods not gone yet."""
        return [p for p in (*self.evicted, *self.terminating) if not p.gone]


COLUMNS = "id, node, state, started, updated, body"
Row = tuple[str, str, str, float, float, bytes]


def to_row(r: DrainRecord) -> Row:
    """The row as it is now (taken on the event loop, written later in the store thread)."""
    return (r.id, r.node, r.state, r.started, r.updated, msgspec.json.encode(r))


def _record(row: tuple[object, ...]) -> DrainRecord:
    body = row[-1]
    assert isinstance(body, bytes | str)
    return msgspec.json.decode(body, type=DrainRecord)


def save(conn: Conn, row: Row) -> None:
    conn.execute(upsert("drains", COLUMNS, "id"), row)


def list_rows(conn: Conn, node: str, limit: int) -> list[DrainRecord]:
    """Newest first, optionally one node's."""
    return [_record(row) for row in newest_rows(conn, "drains", COLUMNS, "started", node=node, limit=limit)]


def load_running(conn: Conn) -> list[DrainRecord]:
    """The drains a previous controller left running, oldest first: what a starting one resumes."""
    rows = conn.execute(f"SELECT {COLUMNS} FROM drains WHERE state = ? ORDER BY started, id", (RUNNING,))
    return [_record(row) for row in rows]
