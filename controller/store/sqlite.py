"""The SQLite store: nodes, boots (ack positions), latest GPU/host/BMC state, probe results, findings,
commands (controller/store/commands.py), the audit log and the breaker's state (controller/store/audit.py),
tuning recommendations (controller/store/recommendations.py), drains (controller/store/drains.py).

All functions here run in the store thread (see writer.py); `Store` is the async face the rest of
the controller uses.
"""

from __future__ import annotations

import asyncio
import copy
import json
import sqlite3
from collections import deque
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from time import perf_counter
from typing import TypeVar

import msgspec

from controller.fleet.finding import Finding
from controller.fleet.findings import StoredFinding
from controller.fleet.model import HISTORY_POINTS, Fleet, FrameWrite, GpuState, NodeState, ProbeRecord
from controller.fleet.silencing import Ack, Maintenance, Silence, Silencing
from controller.metrics_record import STORE_BUCKETS, LabelledHistograms
from controller.paging import FindingKey
from controller.store import audit as audit_rows
from controller.store import commands as command_rows
from controller.store import drains as drain_rows
from controller.store import finding_pages
from controller.store import forget as forget_rows
from controller.store import recommendations as recommendation_rows
from controller.store import silences as silence_rows
from controller.store.audit import AuditEntry
from controller.store.checkpoint import Checkpointer
from controller.store.commands import CommandRecord
from controller.store.drains import DrainRecord
from controller.store.recommendations import Recommendation
from controller.store.writer import StoreThread
from protos.gpufleet.v1 import bmc_pb2
from protos.gpufleet.v1 import telemetry_pb2 as pb

T = TypeVar("T")
SCHEMA_VERSION = 1
OPERATIONS = (
    "init",
    "load",
    "save_hello",
    "save_frame",
    "save_latest",
    "save_findings",
    "list_findings",
    "prune_history",
    "save_command",
    "list_commands",
    "load_commands",
    "audit",
    "list_audit",
    "breaker",
    "recommendations",
    "drains",
    "silences",
)


class Store:
    def __init__(self, path: str, *, synchronous: str = "full") -> None:
        self.path = path
        self.synchronous = synchronous.upper()
        self._thread = StoreThread(self._connect)
        # WAL checkpoints in a thread of their own, not inside a commit (controller/store/checkpoint.py).
        self.checkpointer = Checkpointer(path) if path != ":memory:" else None
        # Seconds from a call to its commit (queueing and group commit included), per operation.
        self.latency = LabelledHistograms(STORE_BUCKETS, OPERATIONS)

    def _connect(self) -> sqlite3.Connection:
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        if self.path != ":memory:":
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA wal_autocheckpoint=0")  # the Checkpointer's work (checkpoint.py)
        conn.execute(f"PRAGMA synchronous={self.synchronous}")
        conn.execute("PRAGMA busy_timeout=5000")
        return conn

    async def _call(self, operation: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        start = perf_counter()
        try:
            return await self._thread.call(fn)
        finally:
            self.latency.observe(operation, perf_counter() - start)

    async def open(self) -> None:
        self._thread.start()
        await self._call("init", _init)
        if self.checkpointer is not None:
            self.checkpointer.start()

    def close(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.stop()
        self._thread.stop()  # the last connection to close checkpoints what is left

    async def load(self) -> tuple[Fleet, list[StoredFinding]]:
        return await self._call("load", _load)

    async def save_hello(self, hello: pb.Hello, now: float) -> int:
        """Record the node's Hello; return the acked seq of its boot (0 if new)."""
        return await self._call("save_hello", lambda c: _save_hello(c, hello, now))

    async def save_frame(self, write: FrameWrite) -> None:
        await self._call("save_frame", lambda c: _save_frame(c, write))

    def queue_latest(self, nodes: Sequence[NodeState]) -> asyncio.Future[None]:
        """Queue these nodes' latest readings as memory holds them now (Ingest.save_state); the
        future settles once they are committed."""
        rows = [(n.name, list(n.gpus.values()), n.host, n.host_time) for n in nodes]

        def save(conn: sqlite3.Connection) -> None:
            for row in rows:
                _save_latest(conn, *row)

        start = perf_counter()
        future = self._thread.submit(save)
        future.add_done_callback(lambda _: self.latency.observe("save_latest", perf_counter() - start))
        return future

    async def save_findings(self, upserts: list[StoredFinding], resolved: list[StoredFinding]) -> None:
        await self._call("save_findings", lambda c: _save_findings(c, upserts + resolved))

    async def list_findings(
        self, node: str = "", include_resolved: bool = False, limit: int = 1000
    ) -> list[StoredFinding]:
        return await self._call("list_findings", lambda c: _list_findings(c, node, include_resolved, limit))

    async def list_findings_page(
        self,
        node: str,
        include_resolved: bool,
        severities: Sequence[str] | None,
        after: FindingKey | None,
        limit: int,
        *,
        since: float | None = None,
    ) -> list[StoredFinding]:
        """A page of findings in the operator API's order (controller/store/finding_pages.py);
        `since`: only those last seen at or after it."""
        return await self._call(
            "list_findings",
            lambda c: finding_pages.list_page(
                c, node, include_resolved, severities=severities, after=after, limit=limit, since=since
            ),
        )

    async def prune_history(self, before: float) -> int:
        """Drop probe history, finished commands and finished recommendations older than `before`."""
        return await self._call(
            "prune_history",
            lambda c: (
                c.execute("DELETE FROM probe_history WHERE time < ?", (before,)).rowcount
                + command_rows.prune_commands(c, before)
                + recommendation_rows.prune(c, before)
            ),
        )

    async def forget_nodes(self, names: list[str]) -> int:
        """Delete every row about these nodes but the audit log's (controller/store/forget.py)."""
        return await self._call("prune_history", lambda c: forget_rows.forget_nodes(c, names))

    def save_command(self, record: CommandRecord) -> asyncio.Future[None]:
        """Queue the command's current state at once (writes keep their order); await to know it is stored."""
        row = copy.copy(record)  # the row as it is now, whatever changes before the store thread runs
        start = perf_counter()
        future = self._thread.submit(lambda c: command_rows.save_command(c, row))
        future.add_done_callback(lambda _: self.latency.observe("save_command", perf_counter() - start))
        return future

    async def list_commands(self, node: str = "", limit: int = 100) -> list[CommandRecord]:
        return await self._call("list_commands", lambda c: command_rows.list_commands(c, node, limit))

    async def load_commands(self) -> tuple[list[CommandRecord], list[CommandRecord]]:
        """What a starting controller takes up: the unfinished commands, and those timed out with no
        answer yet (a late answer is still recorded against them)."""
        return await self._call("load_commands", command_rows.load_commands)

    async def add_audit(self, entry: AuditEntry) -> None:
        """Write a request's audit entry; returns once it is committed (so before anything acts)."""
        await self._call("audit", lambda c: audit_rows.add_entry(c, entry))

    async def set_audit_outcome(self, entry_id: str, outcome: str, when: float, detail: str = "") -> None:
        await self._call("audit", lambda c: audit_rows.set_outcome(c, entry_id, outcome, when, detail))

    async def get_audit(self, entry_id: str) -> AuditEntry | None:
        return await self._call("list_audit", lambda c: audit_rows.get_entry(c, entry_id))

    async def list_audit(
        self, node: str = "", since: float | None = None, limit: int = 100
    ) -> list[AuditEntry]:
        return await self._call("list_audit", lambda c: audit_rows.list_entries(c, node, since, limit))

    async def save_recommendation(self, rec: Recommendation) -> None:
        row = recommendation_rows.to_row(rec)  # as it is now, whatever changes before the thread runs
        await self._call("recommendations", lambda c: recommendation_rows.save(c, row))

    async def delete_recommendation(self, rec_id: str) -> None:
        await self._call("recommendations", lambda c: recommendation_rows.delete(c, rec_id))

    # Acks, silences and maintenance (controller/store/silences.py)

    async def load_silencing(self, now: float) -> Silencing:
        """The silences not over at `now`, the nodes under maintenance and every finding's ack."""
        return await self._call("silences", lambda c: silence_rows.load(c, now))

    async def save_silence(self, silence: Silence) -> None:
        row = copy.copy(silence)  # as it is now, whatever changes before the thread runs
        await self._call("silences", lambda c: silence_rows.save_silence(c, row))

    async def get_silence(self, silence_id: str) -> Silence | None:
        return await self._call("silences", lambda c: silence_rows.get_silence(c, silence_id))

    async def list_silences(self, node: str, include_expired: bool, now: float, limit: int) -> list[Silence]:
        return await self._call(
            "silences", lambda c: silence_rows.list_silences(c, node, include_expired, now, limit)
        )

    async def set_maintenance(self, node: str, maintenance: Maintenance | None) -> None:
        await self._call("silences", lambda c: silence_rows.set_maintenance(c, node, maintenance))

    async def save_ack(self, ack: Ack) -> None:
        await self._call("silences", lambda c: silence_rows.save_ack(c, ack))

    async def get_finding(self, finding_id: str) -> StoredFinding | None:
        return await self._call("list_findings", lambda c: silence_rows.get_finding(c, finding_id))

    async def list_recommendations(self, node: str = "", limit: int = 100) -> list[Recommendation]:
        return await self._call("recommendations", lambda c: recommendation_rows.list_rows(c, node, limit))

    async def load_recommendations(self) -> list[Recommendation]:
        return await self._call("recommendations", recommendation_rows.load_all)

    async def save_drain(self, record: DrainRecord) -> None:
        row = drain_rows.to_row(record)  # as it is now, whatever changes before the thread runs
        await self._call("drains", lambda c: drain_rows.save(c, row))

    async def list_drains(self, node: str = "", limit: int = 10) -> list[DrainRecord]:
        return await self._call("drains", lambda c: drain_rows.list_rows(c, node, limit))

    async def load_running_drains(self) -> list[DrainRecord]:
        return await self._call("drains", drain_rows.load_running)

    async def save_breaker(self, state: str, when: float) -> None:
        await self._call("breaker", lambda c: audit_rows.save_breaker(c, state, when))

    async def load_breaker(self) -> str | None:
        return await self._call("breaker", audit_rows.load_breaker)


def _init(conn: sqlite3.Connection) -> None:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise RuntimeError(f"store schema version {version} is newer than this controller ({SCHEMA_VERSION})")
    schema = resources.files("controller.store").joinpath("schema.sql").read_text()
    for statement in schema.split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")


def _save_hello(conn: sqlite3.Connection, hello: pb.Hello, now: float) -> int:
    conn.execute(
        "INSERT INTO nodes (name, hello, first_seen, last_seen) VALUES (?, ?, ?, ?) "
        "ON CONFLICT(name) DO UPDATE SET hello = excluded.hello, last_seen = excluded.last_seen",
        (hello.node, hello.SerializeToString(), now, now),
    )
    row = conn.execute(
        "SELECT acked_seq FROM boots WHERE node = ? AND boot_id = ?", (hello.node, hello.boot_id)
    ).fetchone()
    return int(row[0]) if row else 0


def _save_frame(conn: sqlite3.Connection, w: FrameWrite) -> None:
    """The frame's ack position and probe results always; its latest readings when w.state says so
    (Ingest writes a node's readings at most every db_state_seconds: the next frame replaces them)."""
    conn.execute(
        "INSERT INTO boots (node, boot_id, acked_seq, updated) VALUES (?, ?, ?, ?) "
        "ON CONFLICT(node, boot_id) DO UPDATE SET acked_seq = excluded.acked_seq, "
        "updated = max(boots.updated, excluded.updated)",
        (w.node, w.boot_id, w.seq, w.time),
    )
    if w.state:
        _save_latest(conn, w.node, w.gpus, w.host, w.time)
    if w.bmc is not None:
        conn.execute(
            "INSERT OR REPLACE INTO bmc_state (node, time, sample) VALUES (?, ?, ?)",
            (w.node, w.bmc_time, w.bmc.SerializeToString()),
        )
    if not w.probes:
        return
    rows = [(p.node, -1 if p.gpu is None else p.gpu, p.probe, p.variant, p.time, p.value) for p in w.probes]
    conn.executemany(
        "INSERT OR REPLACE INTO probe_results (node, gpu, probe, variant, time, value, unit, result) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [(*row, p.unit, p.result.SerializeToString()) for row, p in zip(rows, w.probes, strict=True)],
    )
    conn.executemany(
        "INSERT INTO probe_history (node, gpu, probe, variant, time, value) VALUES (?, ?, ?, ?, ?, ?)", rows
    )


def _save_latest(
    conn: sqlite3.Connection,
    node: str,
    gpus: Sequence[GpuState],
    host: pb.HostSample | None,
    host_time: float,
) -> None:
    """A node's latest GPU and host readings (nodes.last_seen is not touched: boots.updated says when
    its newest frame was, and load() takes the later of the two)."""
    conn.executemany(
        "INSERT OR REPLACE INTO gpu_state (node, gpu, time, sample, held) VALUES (?, ?, ?, ?, ?)",
        [(node, g.index, g.time, g.sample.SerializeToString(), json.dumps(g.held)) for g in gpus],
    )
    if host is not None:
        conn.execute(
            "INSERT OR REPLACE INTO host_state (node, time, sample) VALUES (?, ?, ?)",
            (node, host_time, host.SerializeToString()),
        )


def _finding_row(s: StoredFinding) -> tuple[object, ...]:
    f = s.finding
    return (
        s.id,
        f.node,
        f.gpu,
        f.cause,
        f.severity,
        s.first_seen,
        s.last_seen,
        int(s.active),
        msgspec.json.encode(f),
    )


def _save_findings(conn: sqlite3.Connection, findings: list[StoredFinding]) -> None:
    conn.executemany(
        "INSERT OR REPLACE INTO findings"
        " (id, node, gpu, cause, severity, first_seen, last_seen, active, body)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [_finding_row(s) for s in findings],
    )


def _stored(row: sqlite3.Row | tuple[object, ...]) -> StoredFinding:
    fid, first_seen, last_seen, active, body = row
    finding = msgspec.json.decode(body, type=Finding)  # type: ignore[arg-type]
    return StoredFinding(str(fid), finding, float(first_seen), float(last_seen), bool(active))  # type: ignore[arg-type]


def _list_findings(
    conn: sqlite3.Connection, node: str, include_resolved: bool, limit: int
) -> list[StoredFinding]:
    sql = "SELECT id, first_seen, last_seen, active, body FROM findings WHERE 1 = 1"
    args: list[object] = []
    if node:
        sql += " AND node = ?"
        args.append(node)
    if not include_resolved:
        sql += " AND active = 1"
    sql += " ORDER BY last_seen DESC, id LIMIT ?"
    args.append(limit)
    return [_stored(r) for r in conn.execute(sql, args)]


def _load_history(conn: sqlite3.Connection, fleet: Fleet) -> None:
    """The newest HISTORY_POINTS results of each probe key into fleet.history, oldest first (one query)."""
    rows = conn.execute(
        "SELECT node, gpu, probe, variant, time, value FROM ("
        " SELECT *, row_number() OVER (PARTITION BY node, gpu, probe, variant ORDER BY time DESC) AS newest"
        " FROM probe_history) WHERE newest <= ? ORDER BY node, gpu, probe, variant, time",
        (HISTORY_POINTS,),
    )
    for node, gpu, probe, variant, time, value in rows:
        key = (node, None if gpu < 0 else gpu, probe, variant)
        series = fleet.history.get(key)
        if series is None:
            series = fleet.history[key] = deque(maxlen=HISTORY_POINTS)
        series.append((time, value))


def _load(conn: sqlite3.Connection) -> tuple[Fleet, list[StoredFinding]]:
    fleet = Fleet()
    for name, hello_bytes, first_seen, last_seen in conn.execute(
        "SELECT name, hello, first_seen, last_seen FROM nodes"
    ):
        fleet.nodes[name] = NodeState(name, pb.Hello.FromString(hello_bytes), first_seen, last_seen)
    for node, boot_id, acked, updated in conn.execute("SELECT node, boot_id, acked_seq, updated FROM boots"):
        fleet.acked[(node, boot_id)] = int(acked)
        if node in fleet.nodes:  # a frame's time moves boots.updated, not nodes.last_seen
            fleet.nodes[node].last_seen = max(fleet.nodes[node].last_seen, updated)
    for node, gpu, time, sample, held in conn.execute("SELECT node, gpu, time, sample, held FROM gpu_state"):
        if node in fleet.nodes:
            fleet.nodes[node].gpus[gpu] = GpuState(
                gpu, pb.GpuSample.FromString(sample), time, json.loads(held)
            )
    for node, time, sample in conn.execute("SELECT node, time, sample FROM host_state"):
        if node in fleet.nodes:
            fleet.nodes[node].host = pb.HostSample.FromString(sample)
            fleet.nodes[node].host_time = time
    for node, time, sample in conn.execute("SELECT node, time, sample FROM bmc_state"):
        if node in fleet.nodes:
            fleet.nodes[node].bmc = bmc_pb2.BmcSample.FromString(sample)
            fleet.nodes[node].bmc_time = time
    for node, gpu, probe, variant, time, value, unit, result in conn.execute(
        "SELECT node, gpu, probe, variant, time, value, unit, result FROM probe_results"
    ):
        record = ProbeRecord(
            node,
            None if gpu < 0 else gpu,
            probe,
            variant,
            value,
            unit,
            time,
            pb.ProbeResult.FromString(result),
        )
        fleet.probes[record.key] = record
    _load_history(conn, fleet)
    active = _list_findings(conn, "", False, 1_000_000)
    return fleet, active
